"""Back-of-envelope numbers from the live config, and the bottleneck readings from measured
values: what a learner should be able to predict before moving a lever.

Pure functions over plain dicts (the levers, the replicas' reported facts, a metrics snapshot),
so they are tested without a model and reused unchanged by the what-if executor."""

from __future__ import annotations

from typing import Any

from engine.lab.replica_bounds import devices_per_replica

MB = 1024 * 1024


def envelope(levers: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any] | None:
    """facts: what a replica reported about its rank 0 (under tensor parallelism, the largest
    shard): param_bytes (its weights once each), kv_bytes_per_token (its heads' share),
    kv_budget_bytes and copy_gbs (its measured memory bandwidth). None until one reports."""
    needed = ("param_bytes", "kv_bytes_per_token", "kv_budget_bytes", "copy_gbs")
    if not all(facts.get(k) for k in needed):
        return None
    per_token = facts["kv_bytes_per_token"]
    kv_per_seq = per_token * (int(levers["prompt_tokens"]) + int(levers["output_tokens"]))
    seqs_fit = int(facts["kv_budget_bytes"] // kv_per_seq)
    batch = max(1, min(int(levers["max_num_seqs"]), seqs_fit))
    step_ms = decode_step_ms(facts, batch, int(levers["prompt_tokens"]) + int(levers["output_tokens"]) // 2)
    replicas = max(1, int(levers.get("gpu_count", 1)) // devices_per_replica(levers))
    held = max(facts.get("tp_rank_weight_bytes") or [facts.get("weight_bytes") or facts["param_bytes"]])
    return {
        "weight_mb_per_device": facts["param_bytes"] / MB,
        "weight_mb_held": held / MB,
        "kv_kb_per_token": per_token / 1024,
        "kv_mb_per_sequence": kv_per_seq / MB,
        "kv_budget_mb": facts["kv_budget_bytes"] / MB,
        "sequences_fit": seqs_fit,
        "batch": batch,
        "copy_gbs": facts["copy_gbs"],
        "decode_step_ms": step_ms,
        "capacity_tok_s": replicas * batch / (step_ms / 1000),
    }


def decode_step_ms(facts: dict[str, Any], batch: int, mean_context: int) -> float:
    """The memory-bound floor of one decode step on one device: its weights and its share of
    every cached K/V byte of the batch read once, at the measured copy bandwidth. (Collectives
    under tensor parallelism come on top: the bottleneck panel shows them measured.)"""
    bytes_read = facts["param_bytes"] + batch * mean_context * facts["kv_bytes_per_token"]
    return bytes_read / (facts["copy_gbs"] * 1e9) * 1000


def _reading(
    key: str, label: str, ratio: float | None, warn: float, hot: float, text: str, cap: float | None = None
) -> dict[str, Any]:
    """One bottleneck: a measured ratio to its limit, its level (idle, ok, warn, hot), a text."""
    level = "idle" if ratio is None else "hot" if ratio >= hot else "warn" if ratio >= warn else "ok"
    shown = ratio if ratio is None or cap is None else min(ratio, cap)
    return {"key": key, "label": label, "ratio": shown, "level": level, "text": text}


def bottlenecks(levers: dict[str, Any], facts: dict[str, Any], snap: dict[str, Any]) -> list[dict[str, Any]]:
    """Five readings (six for a shard group), each a measured value against its limit."""
    total = snap.get("kv_total_blocks") or 0
    kv = snap["kv_used_blocks"] / total if total else None
    kv_text = f"{snap['kv_used_blocks']} of {total} blocks in use" if total else "no replica reporting"
    out = [_reading("kv_pressure", "KV cache pressure", kv, 0.7, 0.9, kv_text)]

    ranks = facts.get("tp_rank_weight_bytes") or ([facts["weight_bytes"]] if facts.get("weight_bytes") else [])
    share, text = None, "no replica reporting"
    if ranks and facts.get("kv_budget_bytes"):
        per_device = max(ranks)
        share = per_device / (per_device + facts["kv_budget_bytes"])
        if per_device >= 1e9 and len(set(ranks)) == 1:  # a simulated GPU's shard: every rank holds the same
            on_each = f", on each of {len(ranks)}" if len(ranks) > 1 else ""
            text = f"{per_device / 1e9:.1f} GB of weights per device{on_each} ({share:.0%} of its weights + KV memory)"
        else:
            split = " / ".join(f"{b / MB:.0f}" for b in ranks)
            text = f"{split} MB of weights per device ({share:.0%} of its weights + KV memory)"
    out.append(_reading("weights", "Per-device weight footprint", share, 0.5, 0.8, text))

    batch = snap.get("batch_size") or 0
    used, text = None, "no decode running"
    if facts.get("copy_gbs") and batch:
        mean_context = int(levers["prompt_tokens"]) + int(levers["output_tokens"]) // 2
        replicas = max(1, snap.get("replicas", {}).get("ready", 0))
        capacity = replicas * batch / (decode_step_ms(facts, batch, mean_context) / 1000)
        used = snap["tokens_per_s"] / capacity
        text = f"{snap['tokens_per_s']:.0f} tok/s against a roofline of {capacity:.0f} at batch {batch}"
    out.append(_reading("decode", "Decode throughput vs capacity", used, 0.5, 0.8, text))

    slots = snap.get("max_num_seqs") or 0
    saturation = snap["running"] / slots if slots else None
    text = f"{snap['running']} of {slots} slots running" if slots else "no replica reporting"
    out.append(_reading("slots", "Batch slot saturation", saturation, 0.75, 0.95, text))

    target_s = int(levers["ttft_target_ms"]) / 1000
    p99 = snap.get("ttft_p99")
    text = (
        "no finished requests yet"
        if p99 is None
        else f"p99 {p99 * 1000:.0f} ms against a {target_s * 1000:.0f} ms target"
    )
    out.append(_reading("ttft", "Time to first token (p99)", None if p99 is None else p99 / target_s, 0.7, 1.0, text))

    if int(facts.get("tensor_parallel", 1)) > 1:  # a shard group: how much of a step is talking
        reduce_ms, itl = snap.get("allreduce_ms") or 0.0, snap.get("itl_p50")
        text = f"{reduce_ms:.0f} ms of all-reduces per step ({facts.get('allreduces_per_step', 0)} of them)"
        text += "" if itl is None else f", step about {itl * 1000:.0f} ms"
        share = reduce_ms / (itl * 1000) if itl else None
        out.append(_reading("collectives", "All-reduce share of a step", share, 0.3, 0.6, text, cap=1.0))
    return out
