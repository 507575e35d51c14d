"""`python -m bench.sim_disagg`: prefill/decode disaggregation against colocated serving.

Llama-3.1-70B FP8 on 32 H200s (TP4 replicas), 4000 in / 500 out, SLOs TTFT <= 300 ms and
TPOT <= 10 ms (the AIConfigurator example's workload and limits; its model, Qwen3-32B, is not
among the simulator's). For each layout, colocated (8 replicas) and prefill/decode splits, a
sweep of Poisson rates (stopped once goodput has halved past its peak); the best goodput (requests/s meeting both SLOs) is the layout's figure.
Each point is one `python -m engine.sim run` (the same function). Writes
bench/results/sim_disagg.json.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from engine.sim.run import SimSpec, simulate

ROOT = Path(__file__).resolve().parent.parent
LAYOUTS = [None, (8, 24), (12, 20), (16, 16), (20, 12), (24, 8)]  # (prefill, decode GPUs); None: colocated
RATES = [4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0]
SECONDS = 60.0  # of arrivals per point


def main() -> None:
    rows = []
    for layout in LAYOUTS:
        best = None
        for rate in RATES:
            spec = SimSpec(
                "llama-3.1-70b", "h200", gpus=32, tp=4, dtype="fp8", kv_dtype="fp8", input_tokens=4000,
                output_tokens=500, num_requests=int(rate * SECONDS), rate=rate, ttft_slo_ms=300, tpot_slo_ms=10,
                prefill_gpus=layout[0] if layout else None, decode_gpus=layout[1] if layout else None,
            )
            r = simulate(spec)
            point = {"rate": rate, "goodput_req_s": r["goodput_req_s"], "ttft_p99_s": r["ttft_p99_s"],
                     "tpot_p99_s": r["tpot_p99_s"], "output_tok_s_per_gpu": r["output_tok_s_per_gpu"]}
            name = "colocated" if layout is None else f"P{layout[0]}/D{layout[1]}"
            print(name, json.dumps({k: round(v, 4) for k, v in point.items()}), flush=True)
            if best is None or point["goodput_req_s"] > best["goodput_req_s"]:
                best = point | {"layout": name}
            elif point["goodput_req_s"] < best["goodput_req_s"] / 2:
                break  # past saturation: higher rates only miss the SLOs more
        assert best is not None
        best["good_tok_s_per_gpu"] = best["goodput_req_s"] * 500 / 32
        rows.append(best)
    base = rows[0]["goodput_req_s"]
    for row in rows:
        row["vs_colocated"] = row["goodput_req_s"] / base if base else None
        print(f"{row['layout']:>10}: goodput {row['goodput_req_s']:.2f} req/s at {row['rate']:g} req/s offered "
              f"({row['good_tok_s_per_gpu']:.0f} good tok/s/GPU), {row['vs_colocated']:.2f}x colocated")
    out = ROOT / "bench" / "results" / "sim_disagg.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"date": datetime.date.today().isoformat(), "command": "python -m bench.sim_disagg",
                               "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
