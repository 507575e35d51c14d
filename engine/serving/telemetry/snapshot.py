"""The fleet's snapshot: what the serving stack measured at one moment, SNAPSHOT_HZ times a second.
The metrics bus fills the measurements, the fleet its own counts; the autoscaler, the what-if
timelines and the labs read the fields; `to_json()` is the live stream's `metrics` payload at its
core (DESIGN.md: the keys and what their times span), the one place it becomes a dict."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

SNAPSHOT_HZ = 6.0  # the live stream promises at least 5 a second (the fleet's, the remote lab's poll)


@dataclass
class FleetSnapshot:
    time: float  # the fleet's clock, seconds
    queue_depth: int = 0  # the central queue
    running: int = 0  # requests in the replicas' running batches
    waiting: int = 0  # handed to a replica and waiting there
    kv_used_blocks: int = 0
    kv_total_blocks: int = 0
    # Over the metrics window (WINDOW_S); None while the window holds no sample.
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    itl_p50: float | None = None
    itl_p99: float | None = None
    tpot_p50: float | None = None  # of the requests that finished in the window
    tpot_p99: float | None = None
    queue_time_p50: float | None = None
    queue_time_p99: float | None = None
    tokens_per_s: float = 0.0
    replicas: dict[str, int] = field(default_factory=dict)  # by state (ReplicaState, PoolState names)
    rejected: dict[str, int] = field(default_factory=dict)  # by reason, since the fleet began
    preempted: int = 0
    batch_size: int = 0  # sequences in the replicas' last steps
    allreduce_ms: float = 0.0  # tensor parallelism: the slowest replica's all-reduce time per step
    # Pipeline parallelism: each stage's idle share (the bubble) over the latest seconds, in the
    # first replica with stages (engine/parallel/stage_clock.py); empty without stages.
    stage_idle: list[float] = field(default_factory=list)
    max_num_seqs: int = 0  # batch slots across the serving replicas
    kv_handoffs: int = 0  # a prefill/decode split's KV handoffs, since the fleet began
    wasted_tokens_per_s: float = 0.0  # made for clients already gone, over the window
    # The /failures gallery's queue, router and scheduler rows: 0 while the window has nothing.
    expired_prefill_tokens: int = 0
    ttft_max: float = 0.0
    ttft_p999: float = 0.0
    prefix_hit_rate: float = 0.0
    # Speculative decoding over the window: the share of guesses kept, and a speculating decode's
    # tokens per step (1 + kept guesses a check); None while nothing speculated.
    spec_acceptance: float | None = None
    spec_tokens_per_step: float | None = None
    # The fleet's own (provisioning.SCALE_COUNTERS and the router's), running totals.
    streams_cut_mid_stream: int = 0
    scale_changes_total: int = 0
    replicas_ordered_total: int = 0
    replica_queue_depths: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value: Any) -> Any:
    """dicts and lists copied (a consumer may add to its payload), enum keys as their strings."""
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    if isinstance(value, list):
        return list(value)
    return value
