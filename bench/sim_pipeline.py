"""Pipeline parallelism in the what-if executor against what was published, and the shapes lesson 06
compares. `python -m bench.sim_pipeline` (a minute of one core; BENCHMARKS.md quotes it).

1. NVIDIA's "Boosting Llama 3.1 405B Throughput by Another 1.5x on NVIDIA H200 Tensor Core GPUs and
   NVLink Switch" (developer.nvidia.com blog, October 2024; TensorRT-LLM, 8 x H200, FP8): tensor
   parallelism across the eight GPUs is 5.6x faster than pipeline parallelism at minimum latency
   (one user), and pipeline parallelism gives 1.5x the maximum throughput. The sequence lengths
   were not in what we could read of it: both ratios are printed at two, and the error is quoted
   against the published ratio for each.
2. Llama-3.1-405B in bf16 on two nodes of 8 H100s: TP8 x PP2 (all-reduces inside a node, one
   activation hop across) against TP16 (every all-reduce across the fabric), and TP8 on one node
   of H200s, at the lesson's traffic."""

from __future__ import annotations

import json
from typing import Any

from engine.sim.run import simulate
from engine.sim.spec import SimSpec

PUBLISHED_LATENCY_TP_OVER_PP = 5.6
PUBLISHED_THROUGHPUT_PP_OVER_TP = 1.5
LENGTHS = ((2048, 128), (1000, 1000))


def h200_405b_fp8(input_tokens: int, output_tokens: int, tp: int, pp: int, num_requests: int) -> dict[str, Any]:
    return simulate(SimSpec(
        "llama-3.1-405b", "h200", gpus=8, tp=tp, pp=pp, dtype="fp8", kv_dtype="fp8", input_tokens=input_tokens,
        output_tokens=output_tokens, num_requests=num_requests,
    ))  # fmt: skip


def published_ratios() -> list[dict[str, Any]]:
    rows = []
    for isl, osl in LENGTHS:
        tp_user = 1 / h200_405b_fp8(isl, osl, 8, 1, 1)["tpot_p50_s"]
        pp_user = 1 / h200_405b_fp8(isl, osl, 1, 8, 1)["tpot_p50_s"]
        tp_max = h200_405b_fp8(isl, osl, 8, 1, 600)["output_tok_s"]
        pp_max = h200_405b_fp8(isl, osl, 1, 8, 600)["output_tok_s"]
        latency, throughput = tp_user / pp_user, pp_max / tp_max
        rows.append({
            "isl_osl": f"{isl}/{osl}", "tp8_tok_s_user": tp_user, "pp8_tok_s_user": pp_user,
            "latency_tp_over_pp": latency, "latency_error": latency / PUBLISHED_LATENCY_TP_OVER_PP - 1,
            "tp8_max_tok_s": tp_max, "pp8_max_tok_s": pp_max,
            "throughput_pp_over_tp": throughput, "throughput_error": throughput / PUBLISHED_THROUGHPUT_PP_OVER_TP - 1,
        })  # fmt: skip
    return rows


LESSON = {"model": "llama-3.1-405b", "output_tokens": 250, "input_range_ratio": 0.5, "num_requests": 300, "rate": 4.0,
          "ttft_slo_ms": 1000.0}  # fmt: skip
SHAPES = (
    ("2 x 8 H100, TP8 x PP2", {"device": "h100", "gpus": 16, "tp": 8, "pp": 2}),
    ("2 x 8 H100, TP8 x PP2, one batch at a time", {"device": "h100", "gpus": 16, "tp": 8, "pp": 2, "pp_overlap": False}),
    ("2 x 8 H100, TP16", {"device": "h100", "gpus": 16, "tp": 16}),
    ("1 x 8 H200, TP8", {"device": "h200", "gpus": 8, "tp": 8}),
)


def lesson_shapes() -> list[dict[str, Any]]:
    rows = []
    for name, shape in SHAPES:
        r = simulate(SimSpec(**(LESSON | shape)))  # type: ignore[arg-type]
        rows.append({
            "shape": name, "output_tok_s": r["output_tok_s"], "ttft_p50_s": r["ttft_p50_s"], "ttft_p99_s": r["ttft_p99_s"],
            "tpot_p50_s": r["tpot_p50_s"], "stage_idle_share": r.get("stage_idle_share"),
        })  # fmt: skip
    return rows


def main() -> None:
    ratios, shapes = published_ratios(), lesson_shapes()
    print("| ISL/OSL | TP8 tok/s/user | PP8 tok/s/user | TP/PP (published 5.6) | PP8 max tok/s | TP8 max tok/s | PP/TP (published 1.5) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in ratios:
        print(
            f"| {r['isl_osl']} | {r['tp8_tok_s_user']:.1f} | {r['pp8_tok_s_user']:.1f} | {r['latency_tp_over_pp']:.2f} "
            f"({r['latency_error']:+.0%}) | {r['pp8_max_tok_s']:.0f} | {r['tp8_max_tok_s']:.0f} | "
            f"{r['throughput_pp_over_tp']:.2f} ({r['throughput_error']:+.0%}) |"
        )
    print("\n| 405B bf16, 4 req/s | output tok/s | TTFT p50 | TTFT p99 | TPOT p50 | stage idle share |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in shapes:
        idle = ", ".join(f"{x:.0%}" for x in r["stage_idle_share"]) if r["stage_idle_share"] else "-"
        print(
            f"| {r['shape']} | {r['output_tok_s']:.0f} | {r['ttft_p50_s']:.3f} s | {r['ttft_p99_s']:.3f} s | "
            f"{r['tpot_p50_s'] * 1000:.1f} ms | {idle} |"
        )
    print(json.dumps({"published_ratios": ratios, "lesson_shapes": shapes}))


if __name__ == "__main__":
    main()
