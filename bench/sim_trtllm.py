"""`python -m bench.sim_trtllm`: the what-if executor against TensorRT-LLM's published throughput.

The five rows of REFERENCES.md (TensorRT-LLM perf-overview, `trtllm-bench throughput`), run with
the settings those runs used: every request queued at once, fixed lengths, FP8 weights and KV,
max batch 8,192, 8,192 batched tokens, KV 0.90 of free memory, and TensorRT-LLM's default
capacity policy (guaranteed-no-evict: `--admission reserve`). Each row is one `python -m
engine.sim run` (the same function); `--greedy` adds vLLM's preempting admission for contrast.
Writes bench/results/sim_trtllm.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from engine.sim.run import SimSpec, simulate

ROOT = Path(__file__).resolve().parent.parent
# (model, GPUs = TP, ISL, OSL, requests, published output tok/s)
ROWS = [
    ("llama-3.1-8b", 1, 128, 128, 30000, 28312),
    ("llama-3.1-8b", 1, 1000, 1000, 3000, 15220),
    ("llama-3.1-8b", 1, 2048, 128, 3000, 3450),
    ("llama-3.1-70b", 2, 1000, 1000, 3000, 4205),  # Llama-3.3-70B: the same shape as 3.1
    ("llama-3.1-70b", 2, 128, 2048, 3000, 6651),
]


def row_spec(model: str, tp: int, isl: int, osl: int, n: int, admission: str) -> SimSpec:
    return SimSpec(
        model, "h100", gpus=tp, tp=tp, dtype="fp8", kv_dtype="fp8", input_tokens=isl, output_tokens=osl,
        num_requests=n, rate=float("inf"), max_num_seqs=8192, max_batched_tokens=8192, admission=admission,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--greedy", action="store_true", help="also run vLLM's greedy (preempting) admission")
    ap.add_argument("--rows", type=int, nargs="*", default=list(range(len(ROWS))))
    args = ap.parse_args()
    results = []
    for i in args.rows:
        model, tp, isl, osl, n, published = ROWS[i]
        for admission in ("reserve", "greedy") if args.greedy else ("reserve",):
            r = simulate(row_spec(model, tp, isl, osl, n, admission))
            err = r["output_tok_s"] / published - 1
            results.append({"model": model, "tp": tp, "isl": isl, "osl": osl, "requests": n, "admission": admission,
                            "published": published, "predicted": round(r["output_tok_s"]), "error": round(err, 4),
                            "preemptions": r["preemptions"], "kv_usage_max": r["kv_usage_max"], "wall_s": r["wall_s"]})
            print(f"{model} TP{tp} {isl}/{osl} {admission}: predicted {r['output_tok_s']:.0f} tok/s, published "
                  f"{published}: {100 * err:+.1f}% (preemptions {r['preemptions']}, wall {r['wall_s']:.0f} s)", flush=True)
    out = ROOT / "bench" / "results" / "sim_trtllm.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"date": datetime.date.today().isoformat(), "command": "python -m bench.sim_trtllm",
                               "rows": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
