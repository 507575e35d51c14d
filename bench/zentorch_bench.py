"""zentorch (AMD's ZenDNN plugin for torch) against the engine's prepacked oneDNN linears, on
SmolLM2's GEMM shapes (bf16; batch-64 decode and a 2,048-token prefill; one thread):
`python -m bench.zentorch_bench`. The issue asked to try it as an optional backend and keep it
only if it wins. zentorch is not a project dependency; install it beside the bench, matched to
torch 2.13: `pip install --target /tmp/ztlib --no-deps zentorch==2.13.0.2 && pip install
--target /tmp/ztlib deprecated`, then `PYTHONPATH=/tmp/ztlib:. python -m bench.zentorch_bench`."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch

SHAPES = ((576, 960), (576, 3072), (1536, 576), (576, 49152))  # qkv, gate_up, down, lm_head: (K, N)


def median_ms(fn: Callable[[], torch.Tensor], rounds: int = 5, calls: int = 10) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls)
    return statistics.median(times) * 1e3


def main() -> int:
    try:
        import zentorch  # noqa: F401
    except ImportError:
        print("zentorch is not installed: see this file's docstring")
        return 1
    torch.set_num_threads(1)
    pack, linear = torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise
    for m in (64, 2048):
        for k, n in SHAPES:
            x, w = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
            packed = pack(w)
            ours = median_ms(lambda: linear(x, packed, None, "none", [], ""))  # noqa: B023
            theirs = median_ms(lambda: torch.ops.zentorch.zentorch_mm(x, w.t()))  # noqa: B023
            print(f"M={m} K={k} N={n}: oneDNN prepacked {ours:.3f} ms, zentorch_mm {theirs:.3f} ms "
                  f"({theirs / ours:.1f}x as long)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
