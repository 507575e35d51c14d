"""One linear in int8 (the C++ op's servelab::linear_int8: rows quantized, oneDNN's u8 x s8 GEMM,
rows scaled back) against the fp32 prepacked one (mkldnn::_linear_pointwise), at SmolLM2-135M's
four shapes (qkv, o, gate_up, down) and 1, 64 and 2,048 rows; ms per call, mean of 50.

`python -m bench.int8_linear_bench [--isa avx2]`
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def timed(fn: Callable[[], object], repeats: int = 50) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.int8_linear_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--isa", default=None, help="cap the CPU tier (SERVELAB_CPU_ISA), e.g. avx2")
    args = parser.parse_args(argv)
    from engine.platform import machine  # torch-free: the cap is set before torch loads

    machine.apply_isa_override(args.isa)
    import torch

    from engine.kernels import cpu_attention
    from engine.model.int8_linear import int8_linear, quantize_weight

    if not cpu_attention.available():
        print("the C++ op is not built (make kernels)", file=sys.stderr)
        return 1
    print("| linear | rows | fp32 prepacked, ms | int8, ms | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, (n, k) in SHAPES.items():
        weight = torch.randn(n, k)
        q = quantize_weight(weight, "onednn")
        for rows in (1, 64, 2048):
            x = torch.randn(rows, k)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
            fp32 = timed(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))  # noqa: B023
            int8 = timed(lambda: int8_linear(x, q))  # noqa: B023
            print(f"| {name} {n}x{k} | {rows} | {fp32:.3f} | {int8:.3f} | {fp32 / int8:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
