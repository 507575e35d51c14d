"""`python -m bench.whatif_beside_live`: does an A/B run slow the live engine's decode step now
that what-if runs go to the worker (web/whatif_worker.py: one process, nice 19, SCHED_IDLE)?
Run it alone on the machine.

Starts `python app.py` (no browser). Each phase sends the same seeded OpenAI traffic over HTTP
(--rate req/s of --prompt-tokens in, --output-tokens out) and reads the server's own
`vllm:inter_token_latency_seconds` before and after: its mean over the phase is the live decode
step as its streams saw it. Phase A: nothing else. Phase B: A/B runs of --preset posted to
/whatif/ab back to back for the whole phase. A B A B (--rounds); the goal is B / A <= 1.05."""

from __future__ import annotations

import argparse
import json
import threading
import time

from bench.sim_beside_live import add_phase_args, phase
from bench.sim_web_cpu import app_server
from tests.support.server_process import ServerProcess


def ab_runs_until(server: ServerProcess, preset: str, stop: threading.Event, done: list[float]) -> None:
    while not stop.is_set():
        start = time.monotonic()
        status, body = server.request("POST", "/whatif/ab", {"preset": preset})
        if status != 200:
            raise RuntimeError(f"/whatif/ab answered {status}: {body[:200]!r}")
        done.append(time.monotonic() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_phase_args(ap)
    ap.add_argument("--preset", default="colocated_vs_disaggregated")
    args = ap.parse_args()
    rows = []
    with app_server() as server:
        for i in range(args.rounds):
            for name in ("A", "B"):
                stop, runs = threading.Event(), []
                worker = None
                if name == "B":
                    worker = threading.Thread(target=ab_runs_until, args=(server, args.preset, stop, runs))
                    worker.start()
                row = {"phase": name, "round": i} | phase(server, args, seed=i)  # same traffic in A and B
                stop.set()
                if worker is not None:
                    worker.join()
                    row["ab_runs"], row["ab_run_s"] = len(runs), round(sum(runs) / max(1, len(runs)), 2)
                rows.append(row)
                print(json.dumps(row), flush=True)
    mean = {n: sum(r["mean_step_ms"] for r in rows if r["phase"] == n) / args.rounds for n in ("A", "B")}
    summary = {"A_mean_step_ms": round(mean["A"], 3), "B_mean_step_ms": round(mean["B"], 3)}
    print(json.dumps(summary | {"ratio_B_over_A": round(mean["B"] / mean["A"], 4), "rounds": rows}, indent=1))


if __name__ == "__main__":
    main()
