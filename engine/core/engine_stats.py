"""What one replica's engine reports of itself (LLMEngine.stats()): its queues, KV blocks and
tokens, running totals, speculation's counts, the static facts of its weights and KV cache, and
its sharding (ShardStats, the same fields for one rank). A live replica's process adds what it
knows (engine/serving/replicas/messages.py's ReplicaStats); the what-if replica fills the counts it
keeps. Torch-free: the web process reads it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from engine.parallel.ranks import ShardStats


@dataclass
class EngineStats(ShardStats):
    # What the router and autoscaler decide on.
    running: int = 0
    waiting: int = 0
    kv_used_blocks: int = 0
    kv_total_blocks: int = 0
    batch_size: int = 0  # sequences in the latest step
    # Running totals (the metrics bus's COUNTERS keep a retired replica's).
    num_preemptions: int = 0
    num_expired: int = 0  # dropped at their deadline inside the replica
    expired_prefill_tokens: int = 0  # prompt tokens prefilled for requests already past it
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_steps: int = 0
    # Speculative decoding (engine/sample/spec_decode.py): verify passes, guesses checked, guesses kept.
    spec_checks: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    kv_tokens_used: int = 0  # the running sequences' computed tokens
    kv_tokens_reserved: int = 0  # the blocks they hold, in tokens
    # Static facts for the lab's back-of-envelope panel (live only): what weights and KV cost.
    weight_bytes: int = 0
    param_bytes: int = 0
    kv_budget_bytes: int = 0
    kv_bytes_per_token: int = 0

    @property
    def free_blocks(self) -> int:
        return self.kv_total_blocks - self.kv_used_blocks


def field_values(record: Any) -> dict[str, Any]:
    """A dataclass's fields as keywords, one level deep (the lists are shared, not copied): how a
    record is widened into the one that extends it (ShardStats -> EngineStats -> ReplicaStats)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}
