"""The model's linears on each matmul path this CPU offers, per row count: torch's F.linear (MKL
on x86) against oneDNN's prepacked weights, in fp32 and bf16, for SmolLM2-135M's shapes.

    SERVELAB_CPU_ISA=avx2 python -m bench.linear_paths     (as on an AVX2 CPU)
    python -m bench.linear_paths

What engine/platform/machine.py's linear_path chooses should be the faster one here. Run it alone.
"""

from __future__ import annotations

import math
import sys
import time

from engine.platform import machine

machine.apply_isa_override()  # SERVELAB_CPU_ISA caps torch's kernels: before torch reads its environment

import torch
import torch.nn.functional as F

# (name, out_features, in_features) of one layer, and the LM head
SHAPES = (("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536), ("lm_head", 49152, 576))
ROWS = (1, 8, 64, 512, 2048)


def best_ms(fn, repeats: int = 7) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def main() -> int:
    info = machine.cpu()
    print(f"{info.describe()}; torch capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    for dtype in (torch.float32, torch.bfloat16):
        print(f"\n{dtype}: ms per layer's 4 linears (+ LM head), F.linear / oneDNN prepacked")
        for m in ROWS:
            plain = packed = 0.0
            for name, n, k in SHAPES:
                if name == "lm_head" and m > 64:
                    continue
                w = torch.randn(n, k, dtype=dtype)
                x = torch.randn(m, k, dtype=dtype)
                plain += best_ms(lambda x=x, w=w: F.linear(x, w))
                try:
                    p = torch.ops.mkldnn._reorder_linear_weight(w)
                    packed += best_ms(lambda x=x, p=p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""))
                except RuntimeError as err:
                    packed = float("nan")
                    reason = str(err).split("\n")[0][:80]
            note = f"  (prepack refused: {reason})" if math.isnan(packed) else f"  {plain / packed:.2f}x"
            print(f"  M={m:5}: {plain:8.3f} / {packed:8.3f}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
