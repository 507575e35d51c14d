"""Phase 01: the Triton kernels (engine/kernels/triton_attention.py) against the torch
implementation, as tests/test_triton_attention.py holds them, on CUDA in bf16, fp16 and fp32: decode
with and without split-K (a long context takes several splits), prefill over a cached prefix,
store_kv; each compiled kernel's registers and spills; compute-sanitizer's memcheck on a small
case where the binary exists.

The reference is the torch implementation over the same inputs in float32 (16-bit torch would round
its scores and probabilities where the kernels keep fp32: the comparison would measure torch)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import torch

from bench.device_check.common import PhaseContext

# As tests/support/attention_cases.py: relative and absolute tolerance against float32 over the same inputs.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# (query heads, KV heads, head_dim): SmolLM2-135M's, and Llama-3.1-8B's.
SHAPES = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}
BLOCK_SIZE = 16  # the engine's default
SANITIZER_TIMEOUT_S = 55
BF16_INTERPRETER = "the Triton interpreter computes bf16 wrongly (numpy has no bf16): fp16 and fp32 only"


@dataclass(frozen=True)
class Sizes:
    decode_lens: list[int]
    long_lens: list[int]  # a context long enough that the default split count is above 1 on a GPU
    prefills: list[tuple[int, int]]  # (cached, new)
    store_tokens: int


GPU_SIZES = Sizes([1, 17, 150, 700], [3000, 5], [(0, 300), (100, 77)], 40)
DRY_SIZES = Sizes([1, 17, 70], [200, 5], [(0, 24), (20, 13)], 12)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def paged_caches(
    lens: list[int], kvh: int, d: int, dtype: torch.dtype, gen: torch.Generator, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """K/V caches in the engine's heads-outermost storage, each sequence's tokens in shuffled blocks;
    every slot no sequence owns holds large values, so a read past a context shows in the output."""
    per_seq = [cdiv(n, BLOCK_SIZE) for n in lens]
    num_blocks = sum(per_seq) + 3
    caches = []
    for _ in range(2):
        storage = (100 * torch.randn(kvh, num_blocks, BLOCK_SIZE, d, generator=gen)).to(dtype).to(device)
        caches.append(storage.permute(1, 2, 0, 3))
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = []
    for n, blocks in zip(lens, per_seq):
        table = [free.pop() for _ in range(blocks)]
        pos = torch.arange(n)
        slots = (torch.tensor(table)[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE).to(device)
        for cache in caches:
            rows = torch.randn(n, kvh, d, generator=gen).to(dtype).to(device)
            cache[slots // BLOCK_SIZE, slots % BLOCK_SIZE] = rows  # through the view, into the storage
        tables.append(table + [0] * (max(per_seq) - blocks))
    block_tables = torch.tensor(tables, dtype=torch.int32, device=device)
    return caches[0], caches[1], block_tables, torch.tensor(lens, dtype=torch.int32, device=device)


def max_violation(out: torch.Tensor, want: torch.Tensor) -> tuple[bool, float, float]:
    """(within tolerance and every element written, max abs error, worst error / allowed)."""
    tol = TOLERANCE[out.dtype]
    if out.isnan().any():
        return False, float("nan"), float("inf")
    want = want.to(out.dtype).float()
    err = (out.float() - want).abs()
    ratio = (err / (tol + tol * want.abs())).max().item()
    return ratio <= 1.0, err.max().item(), ratio


def decode_case(
    ta: Any, name: str, lens: list[int], splits: int | None, dtype: torch.dtype, device: str, seed: int
) -> dict[str, Any]:
    from engine.kernels import paged_attention_decode

    heads, kvh, d = SHAPES[name]
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables, context = paged_caches(lens, kvh, d, dtype, gen, device)
    q = torch.randn(len(lens), heads, d, generator=gen).to(dtype).to(device)
    scale = d**-0.5
    out = torch.full_like(q, float("nan"))
    ta.paged_attention_decode(q, k_cache, v_cache, tables, context, scale, out=out, num_splits=splits)
    want = paged_attention_decode(q.float(), k_cache.float(), v_cache.float(), tables, context, scale, impl="torch")
    ok, err, ratio = max_violation(out, want)
    max_context = tables.shape[1] * BLOCK_SIZE
    used = splits if splits is not None else ta._default_num_splits(q.device, len(lens) * kvh, max_context)
    split_len = cdiv(cdiv(max_context, max(used, 1)), ta.TILE_N) * ta.TILE_N
    return {"ok": ok, "max_abs_err": err, "err_over_tol": ratio, "num_splits": cdiv(max_context, split_len)}


def prefill_case(
    ta: Any, name: str, cached: int, new: int, dtype: torch.dtype, device: str, seed: int
) -> dict[str, Any]:
    from engine.kernels import prefill_attention

    heads, kvh, d = SHAPES[name]
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables, _ = paged_caches([cached + new], kvh, d, dtype, gen, device)
    table = tables[0]
    q = torch.randn(new, heads, d, generator=gen).to(dtype).to(device)
    scale = d**-0.5
    out = torch.full_like(q, float("nan"))
    ta.prefill_attention(q, k_cache, v_cache, table, cached, scale, out=out)
    kc, vc = k_cache.float(), v_cache.float()
    flat_k, flat_v = kc.reshape(-1, kvh, d), vc.reshape(-1, kvh, d)
    pos = torch.arange(cached, cached + new, device=device)
    slots = table.long()[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
    k_new, v_new = flat_k[slots], flat_v[slots]
    want = prefill_attention(q.float(), k_new, v_new, kc, vc, table, cached, scale, impl="torch")
    ok, err, ratio = max_violation(out, want)
    return {"ok": ok, "max_abs_err": err, "err_over_tol": ratio}


def store_case(tokens: int, dtype: torch.dtype, device: str, seed: int) -> dict[str, Any]:
    """Triton's store_kv writes exactly what the torch path writes (bit for bit, NaN elsewhere)."""
    from engine.kernels import store_kv

    gen = torch.Generator().manual_seed(seed)
    kvh, d = SHAPES["smollm2"][1:]
    num_blocks = cdiv(tokens, BLOCK_SIZE) + 2
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=gen)[:tokens].to(device)
    qkv = torch.randn(tokens, 3 * kvh * d, generator=gen).to(dtype).to(device)  # strided K/V, as the model's
    k, v = (qkv[:, i * kvh * d : (i + 1) * kvh * d].view(-1, kvh, d) for i in (1, 2))
    written = {}
    for impl in ("torch", "triton"):
        pair = [torch.full((kvh, num_blocks, BLOCK_SIZE, d), float("nan"), dtype=dtype, device=device).permute(1, 2, 0, 3)
                for _ in range(2)]  # fmt: skip
        store_kv(k, v, pair[0], pair[1], slots, impl=impl)
        written[impl] = pair
    same = all(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) for a, b in zip(written["triton"], written["torch"]))
    return {"ok": same}


def compiled_kernels(ta: Any) -> list[dict[str, Any]]:
    """Each compiled specialisation's registers, spills and shared memory, from the JIT functions'
    caches (Triton 3.x: device_caches[device][0] maps a key to its CompiledKernel)."""
    rows = []
    for fn in (ta._attention_kernel, ta._merge_splits_kernel, ta._store_kv_kernel):
        for device_cache in getattr(fn, "device_caches", {}).values():
            for kernel in device_cache[0].values():
                if hasattr(kernel, "_init_handles"):
                    kernel._init_handles()  # registers are known once the binary is loaded
                meta = getattr(kernel, "metadata", None)
                rows.append({
                    "kernel": getattr(kernel, "name", fn.__name__),
                    "num_warps": getattr(meta, "num_warps", None),
                    "num_stages": getattr(meta, "num_stages", None),
                    "shared_bytes": getattr(meta, "shared", None),
                    "n_regs": getattr(kernel, "n_regs", None),
                    "n_spills": getattr(kernel, "n_spills", None),
                })  # fmt: skip
    return rows


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    pattern = [
        "/usr/local/cuda*/bin/compute-sanitizer",
        "/opt/cuda*/bin/compute-sanitizer",
        f"{sys.prefix}/lib/python3*/site-packages/nvidia/**/compute-sanitizer",
    ]
    for p in pattern:
        hits = [h for h in glob.glob(p, recursive=True) if os.path.isfile(h) and os.access(h, os.X_OK)]
        if hits:
            return min(hits)
    return None


def sanitize(ctx: PhaseContext) -> None:
    binary = find_sanitizer()
    if binary is None:
        ctx.skip("memcheck", "no compute-sanitizer binary (PATH, /usr/local/cuda*/bin, the nvidia wheels)")
        return
    ctx.figure("sanitizer", binary)
    # Without torch's caching allocator every tensor is its own allocation, so a read past one is
    # out of bounds to memcheck rather than inside a pooled block.
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    cmd = [binary, "--tool", "memcheck", "--error-exitcode", "7", sys.executable, "-m", __name__, "--sanitize-case"]
    timeout = min(SANITIZER_TIMEOUT_S, ctx.time_left() - 8)  # end before the phase's own timeout
    if timeout < 15:
        ctx.skip("memcheck", f"{ctx.time_left():.0f} s left in the phase: too little for the sanitizer")
        return
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        ctx.check("memcheck", False, f"not done in {timeout:.0f} s", hard=False)
        return
    text = proc.stdout + proc.stderr
    print(text[-6000:])
    summary = next((line for line in reversed(text.splitlines()) if "ERROR SUMMARY" in line), "no ERROR SUMMARY line")
    ctx.check(
        "memcheck", proc.returncode == 0 and "ERROR SUMMARY: 0 errors" in text, f"exit {proc.returncode}: {summary}"
    )


def sanitize_case() -> None:
    """What memcheck runs: one small case of each kernel, the shapes of the main run (compiled
    already: the Triton cache on disk spares the compile under the sanitizer)."""
    from engine.kernels import triton_attention as ta

    results = [
        decode_case(ta, "smollm2", [17, 150], 2, torch.float16, "cuda", 1),
        prefill_case(ta, "smollm2", 100, 77, torch.float16, "cuda", 2),
        store_case(40, torch.float16, "cuda", 3),
    ]
    torch.cuda.synchronize()
    print("sanitize case:", results)


def run(ctx: PhaseContext) -> None:
    if ctx.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported
    from engine.kernels import triton_attention as ta

    device, sizes = ctx.device, DRY_SIZES if ctx.dry_run else GPU_SIZES
    ctx.figure("interpreted", ta.INTERPRETED)
    dtypes = [torch.float16, torch.float32] if ctx.dry_run else [torch.bfloat16, torch.float16, torch.float32]
    if ctx.dry_run:
        ctx.skip("bfloat16", BF16_INTERPRETER)
    worst: dict[str, float] = {}
    seed = 0
    for dtype in dtypes:
        tag = str(dtype).removeprefix("torch.")
        for name in SHAPES:
            cases: dict[str, dict[str, Any]] = {}
            for splits in (None, 1, 3):
                cases[f"decode_splits_{splits}"] = decode_case(ta, name, sizes.decode_lens, splits, dtype, device, seed)
                seed += 1
            cases["decode_long_default_splits"] = long = decode_case(
                ta, name, sizes.long_lens, None, dtype, device, seed
            )
            for cached, new in sizes.prefills:
                cases[f"prefill_{cached}+{new}"] = prefill_case(ta, name, cached, new, dtype, device, seed)
                seed += 1
            for case, result in cases.items():
                ctx.check(f"{tag}/{name}/{case}", result["ok"], result)
            worst[tag] = max(worst.get(tag, 0.0), *(r["err_over_tol"] for r in cases.values()))
            if not ctx.dry_run:  # the default split count is 1 off a GPU (and under the interpreter)
                ctx.check(f"{tag}/{name}/long_context_splits", long["num_splits"] > 1, long)
        ctx.check(
            f"{tag}/store_kv", store_case(sizes.store_tokens, dtype, device, seed)["ok"], "bitwise equal to torch"
        )
    ctx.figure("worst_err_over_tolerance", worst, key=True)
    if ctx.dry_run:
        ctx.skip("registers", "the interpreter compiles nothing: no registers to count")
        ctx.skip("memcheck", "dry run: compute-sanitizer needs a GPU")
        return
    try:
        kernels = compiled_kernels(ta)
    except Exception as exc:  # noqa: BLE001 - Triton's internals move between versions: a figure lost, not the phase
        ctx.check("registers_read", False, f"{type(exc).__name__}: {exc}", hard=False)
        kernels = []
    ctx.figure("compiled_kernels", kernels)
    ctx.figure("max_registers", max((k["n_regs"] or 0 for k in kernels), default=None), key=True)
    spills = sum(k["n_spills"] or 0 for k in kernels)
    ctx.figure("total_spills", spills, key=True)
    ctx.check("kernels_compiled", bool(kernels), f"{len(kernels)} specialisations")
    ctx.check("no_register_spills", spills == 0, f"{spills} spills over {len(kernels)} kernels", hard=False)
    sanitize(ctx)


if __name__ == "__main__" and "--sanitize-case" in sys.argv:
    sanitize_case()
