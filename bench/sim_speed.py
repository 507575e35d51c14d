"""`python -m bench.sim_speed`: how fast the what-if executor runs a big fleet on this machine.

8 replicas x TP8 of Llama-3.1-70B on 64 H100s at 300 req/s (1000 in / 250 out) for 10 simulated
minutes of arrivals (180,000 requests): issue 42's goal is <= 60 s of wall time. FP8 weights
and KV: in bf16 the prefills alone (37.5 req/s x 1000 tokens a replica) need more than the
GPUs' achieved bf16 FLOP/s, and the fleet would only queue. Prints
simulated seconds per wall second; --profile prints where the wall time went (cProfile).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats

from engine.sim.run import SimSpec, simulate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0, help="simulated minutes of arrivals")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    rate = 300.0
    spec = SimSpec("llama-3.1-70b", "h100", gpus=64, tp=8, dtype="fp8", kv_dtype="fp8", input_tokens=1000,
                   output_tokens=250, num_requests=int(rate * 60 * args.minutes), rate=rate)
    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    r = simulate(spec)
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    keys = ("simulated_s", "wall_s", "sim_s_per_wall_s", "steps", "events", "completed", "output_tok_s",
            "ttft_p50_s", "tpot_p50_s", "kv_usage_max", "preemptions")
    print(json.dumps({k: r[k] for k in keys}, indent=1))


if __name__ == "__main__":
    main()
