"""Phase 03: the engine's memory plan (engine/core/memory.py MemoryPlan, LLMEngine.memory) against what
torch's CUDA allocator holds: after the load, after the warm-up (engine/worker/warm_up.py) and at the
peak of a full step (max_num_seqs prompts filling max_batched_tokens), for SmolLM2-135M's shape
and one Llama-3.1-8B layer, in bf16, with the engine's default KV sizing (the whole card by
gpu_memory_utilization: engine/worker/gpu_memory.py).

On every device: the KV cache the runner allocated is exactly the plan's blocks, and the weights
are what the plan counted. On a GPU: the widest step's activations fit what the plan set aside,
and the peak fits what the replica may use. The dry run has no allocator to read (skipped)."""

from __future__ import annotations

from typing import Any

import torch

from bench.device_check import workload
from bench.device_check.common import PhaseContext
from bench.device_check.compare import free_memory
from bench.device_check.weights import LLAMA8B_LAYER, SMOLLM2, ModelShape, dry_run_shape, ensure_model

GIB = 1024**3
DRY_CAP_MB = 512.0  # the CPU's rule is the same at any cap: a smaller one zeroes less on a CI runner


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages under these tensors (the caches are permuted views)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def weight_bytes(model: Any) -> int:
    """The weights as they lie in memory: every distinct parameter storage, plus the prepacked and
    int8 copies (what MemoryPlan.weight_bytes counts)."""
    return storage_bytes(list(model.parameters())) + model.packed_bytes() + model.int8_bytes()


def full_step(shape: ModelShape, llm: Any) -> list[list[int]]:
    """max_num_seqs prompts that together fill max_batched_tokens: one prefill step as wide as the
    scheduler allows in both directions."""
    cfg = llm.engine.config
    per = max(1, cfg.max_batched_tokens // cfg.max_num_seqs)
    return workload.prompts(shape, [per] * cfg.max_num_seqs, seed=3)


def measure(ctx: PhaseContext, shape: ModelShape, tag: str) -> None:
    from engine.worker.warm_up import warm_up

    folder, info = ensure_model(shape, ctx.tmp)
    ctx.figure(f"{tag}/params", info["params"])
    cuda = not ctx.dry_run  # the allocator is read on the GPU run; the dry run has none
    levers: dict[str, Any] = {}
    if not cuda:
        levers["memory_cap_mb"] = DRY_CAP_MB
    base = 0
    if cuda:
        free_memory()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        free, total = torch.cuda.mem_get_info()
        ctx.figure(f"{tag}/free_before_bytes", free)
    dtype = "bfloat16" if cuda else "float32"
    llm = workload.build_llm(folder, ctx.device, dtype, **levers)
    engine, plan = llm.engine, llm.engine.memory
    config = engine.config
    sizing = f"gpu_memory_utilization={config.gpu_memory_utilization}" if cuda else f"memory_cap_mb={config.memory_cap_mb:.0f}"
    ctx.figure(f"{tag}/sizing", sizing, key=True)
    ctx.figure(f"{tag}/plan", {k: getattr(plan, k) for k in plan.__dataclass_fields__} | {"describe": plan.describe()})
    caches = getattr(engine.runner, "kv_caches", None)
    if caches is None:
        raise RuntimeError("engine.worker.runner has no kv_caches: this check reads the KV cache's tensors there")
    kv = storage_bytes([t for pair in caches for t in pair])
    weights = weight_bytes(engine.model)
    # CUDA graphs' padding rows write one scratch block past the plan's (engine/worker/cuda_graphs.py)
    blocks = plan.num_blocks + (getattr(engine.runner, "scratch_block", None) is not None)
    ctx.check(f"{tag}/kv_cache_is_the_plan", kv == blocks * plan.bytes_per_block,
              f"allocated {kv} B, plan {plan.num_blocks} blocks (+ scratch: {blocks}) x {plan.bytes_per_block} B")  # fmt: skip
    ctx.check(
        f"{tag}/weights_are_the_plan", weights == plan.weight_bytes, f"{weights} B held, plan {plan.weight_bytes} B"
    )
    ctx.figure(f"{tag}/kv_gib", round(kv / GIB, 3), key=True)
    if not cuda:
        if engine.config.kv_budget_mb is None:  # the CPU's rule, restated
            room = plan.cap_bytes - plan.weight_bytes - plan.activation_bytes - plan.reserve_bytes
            ctx.check(f"{tag}/kv_budget_is_what_the_cap_leaves", plan.kv_budget_bytes == room, plan.describe())
        warm_up(engine)
        llm.generate([{"prompt_token_ids": p} for p in full_step(shape, llm)], workload.greedy(2, logprobs=None))
        ctx.check(f"{tag}/full_step_ran", engine.stats().num_steps >= 2, engine.stats().num_steps)
        ctx.skip(f"{tag}/allocator", "the CPU has no torch.cuda.max_memory_allocated to hold the plan to")
        workload.close(llm)
        return
    after_load = torch.cuda.memory_allocated() - base
    ctx.figure(f"{tag}/allocated_after_load_bytes", after_load)
    # Everything held once loaded is weights, KV, RoPE tables and what a CUDA graph keeps: the
    # plan's weights + KV + activations bound it.
    bound = plan.weight_bytes + kv + plan.activation_bytes
    ctx.check(f"{tag}/load_within_plan", after_load <= bound,
              f"{after_load / GIB:.3f} GiB held after load; weights + KV + activations planned {bound / GIB:.3f} GiB")  # fmt: skip
    warm_s = warm_up(engine)
    ctx.figure(f"{tag}/warm_up_s", round(warm_s, 3))
    ctx.figure(f"{tag}/allocated_after_warm_up_bytes", torch.cuda.memory_allocated() - base)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    batch = full_step(shape, llm)
    llm.generate([{"prompt_token_ids": p} for p in batch], workload.greedy(2, logprobs=None))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    activations = peak - before
    ctx.figure(f"{tag}/full_step_tokens", sum(len(p) for p in batch))
    ctx.figure(f"{tag}/activations_measured_bytes", activations)
    ctx.figure(f"{tag}/activations_measured_over_plan", round(activations / max(plan.activation_bytes, 1), 4), key=True)
    ctx.check(f"{tag}/activations_within_plan", activations <= plan.activation_bytes,
              f"peak - before the step {activations / 2**20:.1f} MiB; planned {plan.activation_bytes / 2**20:.1f} MiB")  # fmt: skip
    free_after, total = torch.cuda.mem_get_info()
    allowed = int(config.gpu_memory_utilization * total)
    ctx.figure(f"{tag}/peak_allocated_bytes", peak - base)
    ctx.figure(f"{tag}/peak_reserved_bytes", torch.cuda.max_memory_reserved())
    ctx.figure(f"{tag}/used_on_card_bytes", total - free_after)
    ctx.check(
        f"{tag}/peak_within_allowed",
        peak - base <= allowed,
        f"peak {(peak - base) / GIB:.2f} GiB, allowed {allowed / GIB:.2f} GiB",
    )
    # The card as a whole (other processes, the CUDA context, cuBLAS workspaces): soft, as vLLM's rule.
    ctx.check(f"{tag}/card_within_utilization", total - free_after <= allowed + 2 * GIB,
              f"{(total - free_after) / GIB:.2f} GiB used on the card", hard=False)  # fmt: skip
    workload.close(llm)


def run(ctx: PhaseContext) -> None:
    for base, tag in ((SMOLLM2, "smollm2"), (LLAMA8B_LAYER, "llama8b_layer")):
        shape = dry_run_shape(base) if ctx.dry_run else base
        if shape.note:
            ctx.skip(f"{tag}/full_shape", shape.note)
        measure(ctx, shape, tag)
