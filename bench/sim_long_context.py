"""`python -m bench.sim_long_context`: the what-if executor against vLLM's own long-context runs
(issue 42, part 2), each row under three admission rules: greedy (vLLM v1: a prompt starts once its
first chunk fits), greedy with vLLM v0's 1% watermark (a prompt starts once all of it fits with 1%
of the blocks left free: EngineConfig.kv_watermark) and reserve (TensorRT-LLM's guaranteed-no-evict).

Source: dstackai/benchmarks, vLLM 0.6.3 (v0 engine) `benchmark_throughput.py`: every request queued
at once, fixed lengths 32,784 in and 2,048 out, Llama 3.1 405B in FP8 with tensor parallelism 8
(dstack.ai blog "Exploring inference memory saturation effect: H100 vs MI300x", 2024-12-05).
- 8 x H100 SXM5, meta-llama/Llama-3.1-405B-FP8 (KV in bf16), vLLM 0.6.3.post2.dev308:
  nvidia/8xh100/charts/throughput_output.csv (elapsed_time per num_requests). The README beside it
  (nvidia/8xh100/README.md) gives the longest context the setup held, 91,680 tokens: vLLM refuses a
  max_model_len above its KV cache, so that is the cache (5,730 blocks of 16), which the rows
  pin (KV_TOKENS) instead of the simulator's own memory plan (420,448 tokens there).
- 8 x MI300X, amd/Llama-3.1-405B-Instruct-FP8-KV (KV in FP8), ROCm vLLM 0.6.3.dev116:
  comparison/h100sxm5_vs_mi300x/csv_data/throughput_latency_curve_32784_2048.csv. Its KV cache holds
  every request at once: no admission rule can matter (the control).

Published output tokens/s = requests x 2,048 / elapsed_time (the CSVs' tokens_per_second counts the
prompts too). Not published, so vLLM 0.6.3's defaults are assumed: chunked prefill at 512 tokens a
step (on by default above a 32K context; vllm/config.py SchedulerConfig), 256 sequences, blocks of
16, async output processing (host profile vllm-0.6-multistep at one step). Nothing is fitted.
Writes bench/results/sim_long_context.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from engine.sim.run import SimSpec, simulate

ROOT = Path(__file__).resolve().parent.parent
DSTACK = "dstackai/benchmarks"
ISL, OSL = 32784, 2048
KV_TOKENS = {"h100": 91680}  # the KV cache the source reports; elsewhere the simulator's own plan
MI300X_CSV = "comparison/h100sxm5_vs_mi300x/csv_data/throughput_latency_curve_32784_2048.csv"
# (device, KV dtype, requests, elapsed s, source file)
ROWS = [
    ("h100", "bf16", 4, 236.1237305, "nvidia/8xh100/charts/throughput_output.csv"),
    ("h100", "bf16", 8, 457.6965823, "nvidia/8xh100/charts/throughput_output.csv"),
    ("h100", "bf16", 16, 866.9613514, "nvidia/8xh100/charts/throughput_output.csv"),
    *(("mi300x", "fp8", n, s, MI300X_CSV) for n, s in ((4, 129.3197857), (8, 158.0476773), (16, 223.162426),
                                                     (32, 353.0339651), (64, 720.3670517))),
]
RULES = {"greedy": ("greedy", 0.0), "greedy+watermark": ("greedy", 0.01), "reserve": ("reserve", 0.0)}


def row_spec(device: str, kv_dtype: str, requests: int, admission: str, watermark: float) -> SimSpec:
    spec = SimSpec(
        "llama-3.1-405b", device, gpus=8, tp=8, dtype="fp8", kv_dtype=kv_dtype, input_tokens=ISL, output_tokens=OSL,
        num_requests=requests, rate=float("inf"), max_num_seqs=256, max_batched_tokens=512,
        admission=admission, kv_watermark=watermark, host_profile="vllm-0.6-multistep",
    )
    if device in KV_TOKENS:  # per GPU: the cache's tokens x one rank's K and V of a token
        spec.kv_budget_mb = KV_TOKENS[device] * spec.deployment().kv_bytes_per_token / 2**20
    return spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="*", default=list(range(len(ROWS))))
    args = ap.parse_args()
    results = []
    for i in args.rows:
        device, kv_dtype, n, elapsed, path = ROWS[i]
        published = n * OSL / elapsed
        record = {"device": device, "gpus": 8, "tp": 8, "kv_dtype": kv_dtype, "isl": ISL, "osl": OSL, "requests": n,
                  "source": f"{DSTACK} {path}", "published_output_tok_s": round(published, 2), "rules": {}}
        for name, (admission, watermark) in RULES.items():
            r = simulate(row_spec(device, kv_dtype, n, admission, watermark))
            err = r["output_tok_s"] / published - 1
            record["rules"][name] = {"predicted_output_tok_s": round(r["output_tok_s"], 2), "error": round(err, 4),
                                     "preemptions": r["preemptions"], "running_max": r.get("running_max")}
            print(f"{i}: 405B fp8 8 x {device} ({kv_dtype} KV) {ISL}/{OSL}, {n} requests, {name}: predicted "
                  f"{r['output_tok_s']:.1f} output tok/s, published {published:.1f}: {100 * err:+.1f}% "
                  f"({r['preemptions']} preemptions, batch max {r.get('running_max')})", flush=True)
        results.append(record)
    out = ROOT / "bench" / "results" / "sim_long_context.json"
    out.write_text(json.dumps({"date": datetime.date.today().isoformat(), "command": "python -m bench.sim_long_context",
                               "kv_tokens": KV_TOKENS, "rows": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
