"""A simulated prefill/decode split seen as one fleet: its two pools' snapshots merged into the
one the lab streams (engine/lab/simulated/lab_sim.py)."""

from __future__ import annotations

from dataclasses import replace

from engine.serving.scaling.provisioning import SCALE_COUNTERS
from engine.serving.telemetry.snapshot import FleetSnapshot


def merge_pools(prefill: FleetSnapshot, decode: FleetSnapshot) -> FleetSnapshot:
    """One snapshot of a prefill/decode split: counts add up; TTFT is the prefill pool's (its
    first token), ITL the decode pool's; the queue is the front (prefill) router's plus the
    hand-off queue."""
    summed = ("queue_depth", "running", "waiting", "kv_used_blocks", "kv_total_blocks", "tokens_per_s",
              "batch_size", "max_num_seqs", "preempted", *SCALE_COUNTERS)  # fmt: skip
    out = replace(prefill, **{key: getattr(prefill, key) + getattr(decode, key) for key in summed})
    out.itl_p50, out.itl_p99 = decode.itl_p50, decode.itl_p99
    for key in ("replicas", "rejected"):
        merged = dict(getattr(prefill, key))
        for name, n in getattr(decode, key).items():
            merged[name] = merged.get(name, 0) + n
        setattr(out, key, merged)
    out.allreduce_ms = max(prefill.allreduce_ms, decode.allreduce_ms)
    return out
