"""Phase 04: the decode step against the HBM roofline. A decode step must read every weight once
and each sequence's KV so far: those bytes over the device-to-device copy bandwidth measured here
(engine/core/memory.py copy_bandwidth_gbs) is the fastest the step can be. Figures: the median decode
step at batch 1 and a larger batch, for SmolLM2-135M's shape and one Llama-3.1-8B layer (bf16),
the fraction of the roofline each reaches, the first decode step of a cold engine against the
later ones, and the same after engine/worker/warm_up.py; where EngineConfig has cuda_graphs, eager
against graphs: the same tokens, and the step-time ratio.

Timings are one card's, one run's: figures, not pass/fail, except what can only be a bug (no
decode step, different tokens with graphs on)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench.device_check import compare, workload
from bench.device_check.common import PhaseContext
from bench.device_check.compare import TOLERANCES
from bench.device_check.weights import LLAMA8B_LAYER, SMOLLM2, ModelShape, dry_run_shape, ensure_model


@dataclass(frozen=True)
class Sizes:
    batches: tuple[int, ...]
    prompt_len: int
    tokens: int  # decode steps per run (+1: the prefill's token)
    copy_mb: int


GPU_SIZES = Sizes((1, 32), 128, 48, 1024)  # a copy far past the 50 MB L2: HBM, not cache
DRY_SIZES = Sizes((1, 4), 16, 6, 64)


def roofline(ctx: PhaseContext, llm: Any, timed: dict[str, Any], bandwidth_gbs: float) -> dict[str, Any]:
    """Each decode step's bytes (weights once, plus the KV of every sequence's context) over the
    measured bandwidth, against the step's time; the median fraction."""
    memory = llm.engine.memory
    kv_per_token = memory.bytes_per_block / memory.block_size
    fractions, step_bytes = [], []
    for took, context in zip(timed["decode_s"], timed["contexts"]):
        needed = memory.param_bytes + context * kv_per_token
        step_bytes.append(needed)
        fractions.append(needed / (bandwidth_gbs * 1e9) / took)
    if not fractions:
        return {}
    return {
        "bytes_per_step": int(statistics.median(step_bytes)),
        "roofline_s": round(statistics.median(step_bytes) / (bandwidth_gbs * 1e9), 6),
        "roofline_fraction": round(statistics.median(fractions), 4),
    }


def timed(llm: Any, shape: ModelShape, batch: int, sizes: Sizes, device: str) -> dict[str, Any]:
    batch_prompts = workload.prompts(shape, [sizes.prompt_len] * batch, seed=10 + batch)  # no prefix hits
    return workload.timed_steps(llm, batch_prompts, sizes.tokens + 1, device)


def record_run(ctx: PhaseContext, tag: str, llm: Any, t: dict[str, Any], bandwidth: float) -> dict[str, Any]:
    figures = workload.step_figures(t) | roofline(ctx, llm, t, bandwidth)
    ctx.figure(tag, figures)
    for name in ("median_decode_s", "roofline_fraction"):
        if figures.get(name) is not None:
            ctx.figure(f"{tag}/{name}", figures[name], key=True)
    ctx.check(f"{tag}/decoded", figures["decode_steps"] > 0, f"{figures['decode_steps']} decode steps")
    fraction = figures.get("roofline_fraction")
    # Faster than reading the bytes once at the copy's bandwidth: the byte count or the bandwidth is off.
    ctx.check(f"{tag}/within_roofline", fraction is not None and fraction <= 1.25, f"fraction {fraction}", hard=False)
    return figures


def run(ctx: PhaseContext) -> None:
    from engine.core.memory import copy_bandwidth_gbs
    from engine.worker.warm_up import warm_up

    sizes = DRY_SIZES if ctx.dry_run else GPU_SIZES
    dtype = "float32" if ctx.dry_run else "bfloat16"  # bf16 on a CPU without it would time emulation
    bandwidth = ctx.figure(
        "copy_bandwidth_gbs", round(copy_bandwidth_gbs(ctx.device, sizes.copy_mb * 2**20), 1), key=True
    )
    elem = 4 if dtype == "float32" else 2
    runs: dict[str, Any] = {}
    for base, tag in ((SMOLLM2, "smollm2"), (LLAMA8B_LAYER, "llama8b_layer")):
        shape = dry_run_shape(base) if ctx.dry_run else base
        if shape.note:
            ctx.skip(f"{tag}/full_shape", shape.note)
        folder, _ = ensure_model(shape, ctx.tmp)
        budget = workload.budget_mb(shape, max(sizes.batches) * (sizes.prompt_len + sizes.tokens + 1), elem)
        llm = workload.build_llm(folder, ctx.device, dtype, kv_budget_mb=budget)  # the defaults: graphs on CUDA
        notes = llm.engine.plan.notes if llm.engine.plan is not None else []
        ctx.figure(f"{tag}/plan_notes", notes)
        if not ctx.dry_run:  # a capture that failed serves eager and says so in the plan's notes
            ctx.check(f"{tag}/cuda_graphs_captured", not any("failed to capture" in n for n in notes), notes)
        for batch in sizes.batches:  # batch 1 first: its first decode step is the cold engine's
            t = timed(llm, shape, batch, sizes, ctx.device)
            runs[f"{tag}/b{batch}"] = t
            record_run(ctx, f"{tag}/b{batch}", llm, t, bandwidth)
        workload.close(llm)
        if tag != "smollm2":
            continue
        cold = runs[f"{tag}/b1"]
        ctx.figure(f"{tag}/cold_first_over_median", workload.step_figures(cold)["first_over_median"], key=True)
        # The warm-up's effect: a fresh engine, warmed as a server warms it, then the same request.
        llm = workload.build_llm(folder, ctx.device, dtype, kv_budget_mb=budget)
        ctx.figure(f"{tag}/warm_up_s", round(warm_up(llm.engine), 3))
        warm = record_run(ctx, f"{tag}/b1_warmed", llm, timed(llm, shape, 1, sizes, ctx.device), bandwidth)
        ctx.figure(f"{tag}/warm_first_over_median", warm["first_over_median"], key=True)
        ctx.check(f"{tag}/warmed_first_step_not_slow", (warm["first_over_median"] or 0) <= 3.0,
                  f"first decode step {warm['first_decode_s']} s, median {warm['median_decode_s']} s", hard=False)  # fmt: skip
        workload.close(llm)
        graphs_against_eager(ctx, folder, shape, sizes, dtype, budget, runs)


def graphs_against_eager(
    ctx: PhaseContext, folder: Any, shape: ModelShape, sizes: Sizes, dtype: str, budget: float, runs: dict[str, Any]
) -> None:
    """The runs above had the default cuda_graphs (True); an eager engine runs the same batches."""
    if ctx.dry_run:
        ctx.skip("cuda_graphs/speed", "CUDA graphs apply on CUDA only: the dry run compares two eager engines")
    margin, tol = TOLERANCES[dtype]
    llm = workload.build_llm(folder, ctx.device, dtype, kv_budget_mb=budget, cuda_graphs=False)
    for batch in sizes.batches:
        eager = timed(llm, shape, batch, sizes, ctx.device)
        graphs = runs[f"smollm2/b{batch}"]
        pairs = zip(workload.as_generated(eager["runs"]), workload.as_generated(graphs["runs"]))
        same = compare.summarise([compare.between_engines(a, b, margin, tol) for a, b in pairs])
        ctx.check(f"cuda_graphs/b{batch}/tokens_as_eager", not same["failed"], same)
        e, g = workload.step_figures(eager), workload.step_figures(graphs)
        ctx.figure(f"cuda_graphs/b{batch}/eager", e)
        if e["median_decode_s"] and g["median_decode_s"]:
            ctx.figure(
                f"cuda_graphs/b{batch}/eager_over_graphs",
                round(e["median_decode_s"] / g["median_decode_s"], 3),
                key=True,
            )
    workload.close(llm)
