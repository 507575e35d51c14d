"""What a new row count costs a prepacked oneDNN linear: SmolLM2's five matmul shapes (qkv, o,
gate_up, down, lm_head) at M = 1..64 (decode batches) and ten prefill-sized M, a first pass (oneDNN
builds a kernel per new shape) against a second. Why a compiled engine warms its step shapes
before it serves (engine/model/compile.py, warm_shapes).

`python -m bench.linear_shapes` (tcmalloc preloaded, as `make bench` runs)."""

from __future__ import annotations

import time

import torch

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]  # (out, in)


def main() -> int:
    torch.set_num_threads(2)
    packed = [torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k).bfloat16()) for n, k in SHAPES]

    def one_pass(rows: range) -> float:
        started = time.perf_counter()
        for m in rows:
            for (_, k), p in zip(SHAPES, packed):
                torch.ops.mkldnn._linear_pointwise(torch.randn(m, k).bfloat16(), p, None, "none", [], "")
        return (time.perf_counter() - started) * 1e3

    for label, rows in (("decode M=1..64", range(1, 65)), ("prefill M=1900..2048 (10)", range(1900, 2049, 16))):
        first, second = one_pass(rows), one_pass(rows)
        print(f"{label:28} first pass {first:7.0f} ms, second {second:7.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
