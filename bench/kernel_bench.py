"""Decode attention kernel bandwidth on a CUDA GPU (a longer run beside bench/device_check).

Times the Triton `paged_attention_decode` with `triton.testing.do_bench` (median, L2 flushed before
every run) in bf16, block size 16, shuffled block tables, for batch 1..128 x context 512..8192,
and prints the K/V bytes it read per second against a device-to-device copy of the same number of
bytes timed the same way (a copy reads and writes, so its GB/s counts both). Two shapes: the
default model's (9 query heads, 3 KV heads, head_dim 64) and an 8B-class one (32 / 8 / 128).
Goal of record: >= 70% of the copy's bandwidth at batch >= 32 and context >= 1k.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

import torch

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
CONTEXTS = (512, 1024, 2048, 4096, 8192)
SHAPES = {"smollm2": (9, 3, 64), "8b": (32, 8, 128)}  # query heads, KV heads, head_dim
BLOCK_SIZE = 16
GOAL = 0.70


@dataclass
class Row:
    shape: str
    batch: int
    context: int
    ms: float
    kernel_gbs: float
    copy_gbs: float

    @property
    def ratio(self) -> float:
        return self.kernel_gbs / self.copy_gbs

    @property
    def in_goal(self) -> bool:
        return self.batch >= 32 and self.context >= 1024


def bench_one(shape: str, batch: int, context: int, dtype: torch.dtype) -> Row:
    import triton.testing

    from engine.kernels import paged_attention_decode

    heads, kv_heads, head_dim = SHAPES[shape]
    blocks_per_seq = context // BLOCK_SIZE
    num_blocks = batch * blocks_per_seq
    dev = "cuda"
    # Heads outermost in memory, as the engine stores it, seen as [num_blocks, block_size, KVH, D].
    k_cache, v_cache = (
        torch.randn(kv_heads, num_blocks, BLOCK_SIZE, head_dim, dtype=dtype, device=dev).permute(1, 2, 0, 3)
        for _ in range(2)
    )
    tables = torch.randperm(num_blocks, device=dev, dtype=torch.int32).view(batch, blocks_per_seq)
    lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    q = torch.randn(batch, heads, head_dim, dtype=dtype, device=dev)
    scale = head_dim**-0.5

    ms = triton.testing.do_bench(
        lambda: paged_attention_decode(q, k_cache, v_cache, tables, lens, scale, impl="triton"), return_mode="median"
    )
    kv_bytes = 2 * batch * context * kv_heads * head_dim * k_cache.element_size()
    moved = kv_bytes + 2 * q.numel() * q.element_size() + tables.numel() * 4

    src = torch.empty(kv_bytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return Row(shape, batch, context, ms, moved / ms / 1e6, 2 * kv_bytes / copy_ms / 1e6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_bench: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, block size {BLOCK_SIZE}")
    rows = []
    for shape in args.shapes:
        heads, kv_heads, head_dim = SHAPES[shape]
        print(f"\n{shape}: {heads} query heads, {kv_heads} KV heads, head_dim {head_dim}")
        print(f"{'batch':>5} {'context':>7} {'median ms':>9} {'kernel GB/s':>11} {'copy GB/s':>9} {'ratio':>6}")
        for batch in BATCHES:
            for context in CONTEXTS:
                row = bench_one(shape, batch, context, torch.bfloat16)
                rows.append(row)
                mark = ("  ok" if row.ratio >= GOAL else "  MISSED") if row.in_goal else ""
                print(
                    f"{batch:>5} {context:>7} {row.ms:>9.4f} {row.kernel_gbs:>11.0f} {row.copy_gbs:>9.0f} "
                    f"{row.ratio:>6.2f}{mark}",
                    flush=True,
                )
    goal_rows = [r for r in rows if r.in_goal]
    worst = min(goal_rows, key=lambda r: r.ratio)
    met = sum(r.ratio >= GOAL for r in goal_rows)
    print(
        f"\ngoal (>= {GOAL:.0%} of copy bandwidth at batch >= 32, context >= 1k): {met}/{len(goal_rows)} met; "
        f"worst {worst.ratio:.2f} ({worst.shape}, batch {worst.batch}, context {worst.context})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) | {"ratio": r.ratio} for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
