"""Back-of-envelope numbers from the live config, and the bottleneck readings from measured
values: what a learner should be able to predict before moving a lever.

Pure functions over the levers, a replica's facts (Facts: typed, live or simulated) and a fleet
snapshot, so they are tested without a model and reused unchanged by the what-if executor. Their
answers (Envelope, Bottleneck) become JSON only where the page gets them (to_json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from engine.lab.replica_bounds import devices_per_replica
from engine.serving.replicas.replica_api import ReplicaStats
from engine.serving.telemetry.snapshot import FleetSnapshot

MB = 1024 * 1024


@dataclass(frozen=True)
class Facts:
    """What a replica reported about its rank 0 (under tensor parallelism, the largest shard):
    the envelope's, the bottleneck panel's and the recommended shape's inputs. Live, a replica's
    stats (of_replica); simulated, the deployment's, per GPU of a TP group (SimLab.facts). 0 or
    empty: not reported (yet)."""

    param_bytes: int = 0  # its weights once each
    weight_bytes: int = 0  # as held (a quantised file's bytes)
    tp_rank_weight_bytes: list[int] = field(default_factory=list)  # each rank of the first stage
    kv_bytes_per_token: int = 0  # its heads' share
    kv_budget_bytes: int = 0
    copy_gbs: float = 0.0  # its measured memory bandwidth
    tensor_parallel: int = 1
    allreduces_per_step: int = 0
    # The simulated deployment's (the live lab reads its own engine config instead).
    weight_bytes_total: int = 0  # every weight once, all devices together
    device_memory_bytes: int = 0
    device_memory_gb: float = 0.0

    @classmethod
    def of_replica(cls, stats: ReplicaStats) -> Facts:
        return cls(
            param_bytes=stats.param_bytes, weight_bytes=stats.weight_bytes,
            tp_rank_weight_bytes=list(stats.tp_rank_weight_bytes), kv_bytes_per_token=stats.kv_bytes_per_token,
            kv_budget_bytes=stats.kv_budget_bytes, copy_gbs=stats.copy_gbs, tensor_parallel=stats.tensor_parallel,
            allreduces_per_step=stats.allreduces_per_step,
        )

    @property
    def roofline_known(self) -> bool:
        """Enough to draw a decode step's memory-bound floor: weights, KV per token, bandwidth."""
        return bool(self.param_bytes and self.kv_bytes_per_token and self.copy_gbs)


@dataclass(frozen=True)
class Envelope:
    """The back-of-envelope panel: what the levers and a replica's facts predict."""

    weight_mb_per_device: float
    weight_mb_held: float
    kv_kb_per_token: float
    kv_mb_per_sequence: float
    kv_budget_mb: float
    sequences_fit: int
    batch: int
    copy_gbs: float
    decode_step_ms: float
    capacity_tok_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Bottleneck:
    """One reading of the bottleneck panel: a measured ratio to its limit, its level (idle, ok,
    warn, hot) and a sentence."""

    key: str
    label: str
    ratio: float | None
    level: str
    text: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def envelope(levers: dict[str, Any], facts: Facts) -> Envelope | None:
    """None until a replica reports its weights, KV per token, KV budget and copy bandwidth."""
    if not (facts.roofline_known and facts.kv_budget_bytes):
        return None
    per_token = facts.kv_bytes_per_token
    kv_per_seq = per_token * (int(levers["prompt_tokens"]) + int(levers["output_tokens"]))
    seqs_fit = int(facts.kv_budget_bytes // kv_per_seq)
    batch = max(1, min(int(levers["max_num_seqs"]), seqs_fit))
    step_ms = decode_step_ms(facts, batch, int(levers["prompt_tokens"]) + int(levers["output_tokens"]) // 2)
    replicas = max(1, int(levers.get("gpu_count", 1)) // devices_per_replica(levers))
    held = max(facts.tp_rank_weight_bytes or [facts.weight_bytes or facts.param_bytes])
    return Envelope(
        weight_mb_per_device=facts.param_bytes / MB,
        weight_mb_held=held / MB,
        kv_kb_per_token=per_token / 1024,
        kv_mb_per_sequence=kv_per_seq / MB,
        kv_budget_mb=facts.kv_budget_bytes / MB,
        sequences_fit=seqs_fit,
        batch=batch,
        copy_gbs=facts.copy_gbs,
        decode_step_ms=step_ms,
        capacity_tok_s=replicas * batch / (step_ms / 1000),
    )


def decode_step_ms(facts: Facts, batch: int, mean_context: int) -> float:
    """The memory-bound floor of one decode step on one device: its weights and its share of
    every cached K/V byte of the batch read once, at the measured copy bandwidth. (Collectives
    under tensor parallelism come on top: the bottleneck panel shows them measured.)"""
    bytes_read = facts.param_bytes + batch * mean_context * facts.kv_bytes_per_token
    return bytes_read / (facts.copy_gbs * 1e9) * 1000


def _reading(
    key: str, label: str, ratio: float | None, warn: float, hot: float, text: str, cap: float | None = None
) -> Bottleneck:
    """One bottleneck: a measured ratio to its limit, its level (idle, ok, warn, hot), a text."""
    level = "idle" if ratio is None else "hot" if ratio >= hot else "warn" if ratio >= warn else "ok"
    shown = ratio if ratio is None or cap is None else min(ratio, cap)
    return Bottleneck(key, label, shown, level, text)


def bottlenecks(levers: dict[str, Any], facts: Facts, snap: FleetSnapshot) -> list[Bottleneck]:
    """Five readings (six for a shard group), each a measured value against its limit."""
    total = snap.kv_total_blocks
    kv = snap.kv_used_blocks / total if total else None
    kv_text = f"{snap.kv_used_blocks} of {total} blocks in use" if total else "no replica reporting"
    out = [_reading("kv_pressure", "KV cache pressure", kv, 0.7, 0.9, kv_text)]

    ranks = facts.tp_rank_weight_bytes or ([facts.weight_bytes] if facts.weight_bytes else [])
    share, text = None, "no replica reporting"
    if ranks and facts.kv_budget_bytes:
        per_device = max(ranks)
        share = per_device / (per_device + facts.kv_budget_bytes)
        if per_device >= 1e9 and len(set(ranks)) == 1:  # a simulated GPU's shard: every rank holds the same
            on_each = f", on each of {len(ranks)}" if len(ranks) > 1 else ""
            text = f"{per_device / 1e9:.1f} GB of weights per device{on_each} ({share:.0%} of its weights + KV memory)"
        else:
            split = " / ".join(f"{b / MB:.0f}" for b in ranks)
            text = f"{split} MB of weights per device ({share:.0%} of its weights + KV memory)"
    out.append(_reading("weights", "Per-device weight footprint", share, 0.5, 0.8, text))

    batch = snap.batch_size
    used, text = None, "no decode running"
    if facts.copy_gbs and batch:
        mean_context = int(levers["prompt_tokens"]) + int(levers["output_tokens"]) // 2
        replicas = max(1, snap.replicas.get("ready", 0))
        capacity = replicas * batch / (decode_step_ms(facts, batch, mean_context) / 1000)
        used = snap.tokens_per_s / capacity
        text = f"{snap.tokens_per_s:.0f} tok/s against a roofline of {capacity:.0f} at batch {batch}"
    out.append(_reading("decode", "Decode throughput vs capacity", used, 0.5, 0.8, text))

    slots = snap.max_num_seqs
    saturation = snap.running / slots if slots else None
    text = f"{snap.running} of {slots} slots running" if slots else "no replica reporting"
    out.append(_reading("slots", "Batch slot saturation", saturation, 0.75, 0.95, text))

    target_s = int(levers["ttft_target_ms"]) / 1000
    p99 = snap.ttft_p99
    text = (
        "no finished requests yet"
        if p99 is None
        else f"p99 {p99 * 1000:.0f} ms against a {target_s * 1000:.0f} ms target"
    )
    out.append(_reading("ttft", "Time to first token (p99)", None if p99 is None else p99 / target_s, 0.7, 1.0, text))

    if facts.tensor_parallel > 1:  # a shard group: how much of a step is talking
        reduce_ms, itl = snap.allreduce_ms, snap.itl_p50
        text = f"{reduce_ms:.0f} ms of all-reduces per step ({facts.allreduces_per_step} of them)"
        text += "" if itl is None else f", step about {itl * 1000:.0f} ms"
        share = reduce_ms / (itl * 1000) if itl else None
        out.append(_reading("collectives", "All-reduce share of a step", share, 0.3, 0.6, text, cap=1.0))
    return out
