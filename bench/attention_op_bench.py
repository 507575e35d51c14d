"""The C++ attention op alone on a batch-64 decode over 30 layers' caches, shaped like the engine
bench's (SmolLM2: 9 query heads, 3 KV heads, head_dim 64, bf16, blocks of 16, contexts 114-463):
`python -m bench.attention_op_bench [--shuffled] [--huge-pages] [--isa TIER] [--dtype DTYPE]`.
--shuffled scatters each sequence's blocks over the cache (a long-running server's), --huge-pages
puts the caches on transparent huge pages (engine/platform/huge_pages.py), as the engine does; --isa caps
the op's routines to a tier (scalar, avx2, avx512, ...: what a CPU of that class runs; default
this one's), --dtype is the caches' and queries'. Prints the median of 15 steps."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from engine.kernels import cpu_attention
from engine.platform import machine
from engine.platform.huge_pages import zeros_on_huge_pages

BATCH, KV_HEADS, HEADS, HEAD_DIM, BLOCK, LAYERS = 64, 3, 9, 64, 16, 30


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shuffled", action="store_true")
    ap.add_argument("--huge-pages", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", choices=machine.X86_TIERS + machine.ARM_TIERS[1:], help="cap the op's routines")
    ap.add_argument("--dtype", choices=["bfloat16", "float32", "float16"], default="bfloat16")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if not cpu_attention.available():
        print("the C++ op is not built: make kernels")
        return 1
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(50, 400, (BATCH,), generator=g) + 64
    blocks = [(n + BLOCK - 1) // BLOCK for n in lens.tolist()]
    num_blocks = sum(blocks) + 10
    order = torch.randperm(num_blocks, generator=g) if args.shuffled else torch.arange(num_blocks)
    tables = torch.zeros(BATCH, max(blocks), dtype=torch.int32)
    start = 0
    for b, n in enumerate(blocks):
        tables[b, :n] = order[start : start + n].int()
        start += n
    shape = (KV_HEADS, num_blocks, BLOCK, HEAD_DIM)  # heads outermost, as engine/worker/runner.py keeps them

    def cache() -> torch.Tensor:
        t = zeros_on_huge_pages(shape, dtype) if args.huge_pages else torch.empty(shape, dtype=dtype)
        return t.copy_(torch.randn(shape, generator=g)).permute(1, 2, 0, 3)

    caches = [(cache(), cache()) for _ in range(LAYERS)]
    q = torch.randn(BATCH, HEADS, HEAD_DIM, generator=g).to(dtype)
    seq_lens, starts = lens.int(), torch.arange(BATCH + 1, dtype=torch.int32)

    def step() -> float:
        t = time.perf_counter()
        for kc, vc in caches:
            cpu_attention.paged_attention(q, kc, vc, tables, seq_lens, starts, HEAD_DIM**-0.5, isa=args.isa)
        return time.perf_counter() - t

    for _ in range(3):
        step()
    median = statistics.median(step() for _ in range(15))
    layout = ("shuffled" if args.shuffled else "in order") + (", huge pages" if args.huge_pages else "")
    isa = min(args.isa or cpu_attention.cpu_isa(), cpu_attention.cpu_isa(), key=tiers().index)
    print(f"batch-64 decode attention, {LAYERS} layers, {args.dtype}, {isa} routines, mean context "
          f"{lens.float().mean():.0f}, blocks {layout}: {median * 1e3:.2f} ms")  # fmt: skip
    return 0


def tiers() -> tuple[str, ...]:
    return machine.X86_TIERS if machine.cpu().arch == "x86_64" else machine.ARM_TIERS


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
