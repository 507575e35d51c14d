"""`python -m bench.sim_holdout`: the what-if executor against rows of TensorRT-LLM's published
throughput table that it was never checked with (issue 29: "published throughput rows the simulator
has not been shown": very long prompts, and FP4 on Blackwell).

Source: NVIDIA/TensorRT-LLM `docs/source/performance/perf-overview.md` (the PyTorch backend's
`trtllm-bench throughput`: every request queued at once, fixed lengths, ModelOpt FP8 checkpoints on
Hopper and FP4 on Blackwell, CUDA graphs to batch 8,192, KV 0.90-0.95 of free memory), each row with
the request count that page gives for its lengths. Run with the settings bench/sim_trtllm.py uses
for the five rows the constants were checked on (guaranteed-no-evict admission, 8,192 batched
tokens); FP4 rows keep FP8 KV. Nothing here is fitted. Writes bench/results/sim_holdout.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from engine.sim.run import SimSpec, simulate

ROOT = Path(__file__).resolve().parent.parent
# Requests per lengths, as the page's "Preparing a Dataset" table gives them.
REQUESTS = {(128, 2048): 3000, (128, 4096): 1500, (1000, 2000): 1500, (2048, 128): 3000, (2048, 2048): 1500,
            (5000, 500): 1500, (1000, 1000): 3000, (500, 2000): 3000, (20000, 2000): 1000}
# (model, device, TP, weights, ISL, OSL, published output tok/s); Llama-3.3-70B has 3.1-70B's shape.
ROWS = [
    ("llama-3.1-8b", "h100", 1, "fp8", 2048, 2048, 9305),
    ("llama-3.1-8b", "h100", 1, "fp8", 5000, 500, 3459),
    ("llama-3.1-8b", "h100", 1, "fp8", 20000, 2000, 1351),
    ("llama-3.1-8b", "h200", 1, "fp8", 20000, 2000, 1804),
    ("llama-3.1-70b", "h100", 2, "fp8", 5000, 500, 898),
    ("llama-3.1-70b", "h100", 2, "fp8", 20000, 2000, 437),
    ("llama-3.1-70b", "h200", 1, "fp8", 1000, 1000, 2909),
    ("llama-3.1-70b", "h200", 1, "fp8", 20000, 2000, 283),
    ("llama-3.1-70b", "b200", 1, "fp4", 1000, 1000, 7007),
    ("llama-3.1-70b", "b200", 1, "fp4", 128, 2048, 9922),
    ("llama-3.1-70b", "b200", 1, "fp4", 2048, 128, 1339),
    ("llama-3.1-70b", "b200", 1, "fp4", 20000, 2000, 665),
    ("llama-3.1-405b", "h200", 8, "fp8", 1000, 1000, 3330),
    ("llama-3.1-405b", "b200", 4, "fp4", 1000, 1000, 5209),
]


def row_spec(model: str, device: str, tp: int, dtype: str, isl: int, osl: int) -> SimSpec:
    return SimSpec(
        model, device, gpus=tp, tp=tp, dtype=dtype, kv_dtype="fp8", input_tokens=isl, output_tokens=osl,
        num_requests=REQUESTS[(isl, osl)], rate=float("inf"), max_num_seqs=8192, max_batched_tokens=8192,
        admission="reserve",
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="*", default=list(range(len(ROWS))))
    args = ap.parse_args()
    results = []
    for i in args.rows:
        model, device, tp, dtype, isl, osl, published = ROWS[i]
        r = simulate(row_spec(model, device, tp, dtype, isl, osl))
        err = r["output_tok_s"] / published - 1
        results.append({"model": model, "device": device, "tp": tp, "dtype": dtype, "isl": isl, "osl": osl,
                        "requests": REQUESTS[(isl, osl)], "published": published, "predicted": round(r["output_tok_s"]),
                        "error": round(err, 4), "kv_usage_max": r["kv_usage_max"], "running_max": r.get("running_max"),
                        "wall_s": r["wall_s"]})
        print(f"{i}: {model} {device} TP{tp} {dtype} {isl}/{osl}: predicted {r['output_tok_s']:.0f} tok/s, published "
              f"{published}: {100 * err:+.1f}% (batch max {r.get('running_max')}, wall {r['wall_s']:.0f} s)", flush=True)
    out = ROOT / "bench" / "results" / "sim_holdout.json"
    out.write_text(json.dumps({"date": datetime.date.today().isoformat(), "command": "python -m bench.sim_holdout",
                               "rows": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
