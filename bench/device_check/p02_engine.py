"""Phase 02: the engine on the device against the engine on the CPU and against HF transformers'
LlamaForCausalLM (float32, same weights: SmolLM2-135M's shape, seeded), in float32 and bfloat16:
greedy tokens (where the reference's margin is clear) and logprobs, of the outputs (the decode
path) and of the prompts (the prefill path); preemption (a KV budget so small that sequences are
preempted and recomputed); a context long enough that decode takes the Triton split-K path.

Dry run: the "device" engine is the CPU one with attention forced onto the Triton kernels under
the interpreter (float32; bf16 takes the CPU kernels, as the interpreter cannot run bf16), so the
same comparisons run over the same kernels' code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.device_check import compare, workload
from bench.device_check.common import PhaseContext
from bench.device_check.compare import TOLERANCES, Generated
from bench.device_check.weights import SMOLLM2, ModelShape, dry_run_shape, ensure_model


@dataclass(frozen=True)
class Sizes:
    prompt_lens: list[int]  # the last is the long one: split-K on a GPU
    max_tokens: int
    preempt_lens: list[int]
    preempt_tokens: int


# 1,500 tokens of context at batch 4 x 3 KV heads: 12 programs would leave an H100's 132 SMs idle,
# so decode splits each context (triton_attention._default_num_splits: 5 splits here).
GPU_SIZES = Sizes([7, 33, 120, 1500], 24, [20, 30, 25, 40], 32)
DRY_SIZES = Sizes([5, 19, 40, 90], 8, [10, 14, 12], 10)
DTYPES = ("float32", "bfloat16")


class SplitCounter:
    """Wraps triton_attention._default_num_splits (read through the module at each call) to
    record the most splits any decode of the engine took."""

    def __init__(self) -> None:
        from engine.kernels import triton_attention as ta

        self.ta, self.original, self.most = ta, ta._default_num_splits, 0

        def counted(*args: Any) -> int:
            n = self.original(*args)
            self.most = max(self.most, n)
            return n

        ta._default_num_splits = counted


def generate(llm: Any, batch: list[list[int]], max_tokens: int, prompt_logprobs: bool) -> list[Generated]:
    params = workload.greedy(max_tokens, logprobs=2, prompt_logprobs=1 if prompt_logprobs else None)
    return compare.from_outputs(llm.generate([{"prompt_token_ids": p} for p in batch], params))


def engine_runs(
    ctx: PhaseContext,
    folder: Path,
    shape: ModelShape,
    sizes: Sizes,
    main: list[list[int]],
    short: list[list[int]],
    splits: SplitCounter | None,
) -> dict[str, Any]:
    """Every engine's outputs, one engine at a time (each freed before the next is built)."""
    runs: dict[str, Any] = {}
    total = sum(sizes.prompt_lens) + len(main) * sizes.max_tokens
    for dtype in DTYPES:
        elem = 4 if dtype == "float32" else 2
        llm = workload.build_llm(folder, ctx.device, dtype, kv_budget_mb=workload.budget_mb(shape, total, elem))
        triton = not ctx.dry_run or dtype == "float32"
        if ctx.dry_run and triton:
            llm.engine.model.attention_impl = "triton"  # the interpreter: the GPU's kernels, on the CPU
        elif ctx.dry_run:
            ctx.skip(f"device_{dtype}/triton", "the Triton interpreter cannot run bf16: the CPU kernels ran instead")
        ctx.figure(f"device_{dtype}/plan", llm.engine.plan.to_json() if llm.engine.plan else None)
        if splits is not None:
            # What the engine's start compiled or captured does not count: only this workload's decodes.
            # (A decode replayed from a CUDA graph calls no Python: its split count is its capture's.)
            splits.most = 0
        runs[f"device_{dtype}"] = generate(llm, main, sizes.max_tokens, prompt_logprobs=True)
        if splits is not None:
            ctx.figure(f"device_{dtype}/most_decode_splits", splits.most)
        runs[f"device_{dtype}_short"] = generate(llm, short, sizes.preempt_tokens, prompt_logprobs=False)
        workload.close(llm)
        # Room for one request at a time and a block to spare: the others are preempted, recomputed.
        blocks = -(-(max(sizes.preempt_lens) + sizes.preempt_tokens) // 16) + 1
        tiny = (blocks + 0.5) * 16 * workload.kv_bytes_per_token(shape, elem) / workload.MB  # + 0.5: float rounding
        llm = workload.build_llm(folder, ctx.device, dtype, kv_budget_mb=tiny, block_size=16)
        if ctx.dry_run and triton:
            llm.engine.model.attention_impl = "triton"
        runs[f"device_{dtype}_preempt"] = generate(llm, short, sizes.preempt_tokens, prompt_logprobs=False)
        runs[f"device_{dtype}_preemptions"] = llm.engine.stats().num_preemptions
        workload.close(llm)
    llm = workload.build_llm(folder, "cpu", "float32", kv_budget_mb=workload.budget_mb(shape, total, 4))
    ctx.figure("cpu_float32/plan", llm.engine.plan.to_json() if llm.engine.plan else None)
    runs["cpu_float32"] = generate(llm, main, sizes.max_tokens, prompt_logprobs=False)
    workload.close(llm)
    return runs


def run(ctx: PhaseContext) -> None:
    shape = dry_run_shape(SMOLLM2) if ctx.dry_run else SMOLLM2
    if shape.note:
        ctx.skip("full_depth", shape.note)
    folder, info = ensure_model(shape, ctx.tmp)
    ctx.figure("model", info, key=False)
    ctx.figure("embed_sha256", info["embed_sha256"][:16], key=True)
    sizes = DRY_SIZES if ctx.dry_run else GPU_SIZES
    main = workload.prompts(shape, sizes.prompt_lens, seed=1)
    short = workload.prompts(shape, sizes.preempt_lens, seed=2)
    splits = None if ctx.dry_run else SplitCounter()
    runs = engine_runs(ctx, folder, shape, sizes, main, short, splits)

    hf = compare.HFReference(folder, ctx.device)
    for dtype in DTYPES:
        margin, tol = TOLERANCES[dtype]
        device = runs[f"device_{dtype}"]
        gen = compare.summarise([compare.against_reference(r, hf.along(r), margin, tol) for r in device])
        ctx.check(f"device_{dtype}/greedy_and_logprobs_vs_hf", not gen["failed"], gen)
        ctx.figure(f"device_{dtype}/worst_logprob_diff_vs_hf", gen["worst_logprob_diff"], key=True)
        prompt = [compare.prompt_against_reference(r, hf.prompt_logprobs(r.prompt), tol) for r in device]
        ctx.check(f"device_{dtype}/prompt_logprobs_vs_hf", all(p["ok"] for p in prompt), prompt)
        # Preempted and recomputed: the same as the roomy engine's, and as HF's along its path.
        preempted = runs[f"device_{dtype}_preempt"]
        count = runs[f"device_{dtype}_preemptions"]
        ctx.figure(f"device_{dtype}/preemptions", count, key=True)
        ctx.check(f"device_{dtype}/preempted", count > 0, f"{count} preemptions with a KV budget of one request")
        pre = compare.summarise([compare.against_reference(r, hf.along(r), margin, tol) for r in preempted])
        ctx.check(f"device_{dtype}/preempt_vs_hf", not pre["failed"], pre)
        pairs = zip(runs[f"device_{dtype}_short"], preempted)
        same = compare.summarise([compare.between_runs(a, b, hf.along(a), margin, tol) for a, b in pairs])
        ctx.check(f"device_{dtype}/preempt_vs_unpreempted", not same["failed"], same)
    margin, tol = TOLERANCES["float32"]
    cpu = runs["cpu_float32"]
    gen = compare.summarise([compare.against_reference(r, hf.along(r), margin, tol) for r in cpu])
    ctx.check("cpu_float32/greedy_and_logprobs_vs_hf", not gen["failed"], gen)
    pairs = zip(cpu, runs["device_float32"])
    both = compare.summarise([compare.between_runs(a, b, hf.along(a), margin, tol) for a, b in pairs])
    ctx.check("device_float32_vs_cpu_float32", not both["failed"], both)
    ctx.figure("device_float32_vs_cpu/worst_logprob_diff", both["worst_logprob_diff"], key=True)
    hf.close()

    if splits is None:
        ctx.skip("split_k", "off a GPU the default split count is 1 (01-kernels runs split-K explicitly)")
    else:
        most = max(ctx.record["figures"].get(f"device_{d}/most_decode_splits", 0) for d in DTYPES)
        ctx.figure("most_decode_splits", most, key=True)
        ctx.check("split_k_taken", most > 1, f"the most splits a decode of the 1,500-token context took: {most}")
