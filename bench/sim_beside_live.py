"""`python -m bench.sim_beside_live`: does a simulation streaming to one browser slow the live
engine's decode step? Run it alone on the machine.

Starts `python app.py` and one browser (Debian chromium) on /lab. Each phase sends the same
seeded OpenAI traffic over HTTP (the load generator's HttpTarget: --rate req/s of
--prompt-tokens in, --output-tokens out) to the live engine and reads the server's own
`vllm:inter_token_latency_seconds` histogram before and after: its mean over the phase is the
live engine's decode step as its streams saw it. Phase A: the lab live, nothing simulated.
Phase B: the lab switched to the simulated 64-GPU fleet (bench/sim_web_cpu.py's) streaming to
the browser. A B A B (--rounds), then the ratio B / A of the mean steps; the goal is <= 1.05."""

from __future__ import annotations

import argparse
import json
import re

from bench.sim_web_cpu import FLEET_64, app_server, browser_page
from engine.model.paths import DEFAULT_MODEL_NAME
from engine.serving.load.loadgen import HttpTarget, arrival_times, make_requests, run_load
from engine.serving.load.loadgen_metrics import RequestStatus
from tests.support.server_process import ServerProcess

ITL = re.compile(r"^vllm:inter_token_latency_seconds_(sum|count)\{[^}]*\} (\S+)$", re.MULTILINE)


def itl_totals(server: ServerProcess) -> tuple[float, float]:
    """(sum, count) of the server's inter-token latency histogram."""
    status, body = server.request("GET", "/metrics")
    assert status == 200, body
    found = dict(ITL.findall(body.decode()))
    return float(found["sum"]), float(found["count"])


def set_levers(page, levers: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    page.evaluate(
        "levers => new Promise((ok, no) => window.servelab.socket.emit('set_levers', levers, a => a.ok ? ok() : no(a.error.message)))",
        levers,
    )


def phase(server: ServerProcess, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """One phase's traffic; the mean decode step (ms) and how many tokens it spans."""
    n = max(1, int(args.rate * args.phase_s))
    requests = make_requests(n, args.prompt_tokens, args.output_tokens, 0.0, seed)
    arrivals = arrival_times(args.rate, n, 1.0, seed)
    before = itl_totals(server)
    records = run_load(HttpTarget(server.base_url, DEFAULT_MODEL_NAME), requests, arrivals, args.phase_s + 120)
    after = itl_totals(server)
    gaps = after[1] - before[1]
    return {
        "mean_step_ms": (after[0] - before[0]) / gaps * 1000 if gaps else float("nan"),
        "gaps": gaps,
        "failed": sum(r.status != RequestStatus.OK for r in records),
    }


def add_phase_args(ap: argparse.ArgumentParser) -> None:
    """The live traffic of each phase (`phase`), shared with bench/whatif_beside_live.py."""
    ap.add_argument("--rounds", type=int, default=2, help="A B pairs")
    ap.add_argument("--phase-s", type=float, default=60.0, help="seconds of arrivals per phase")
    ap.add_argument("--rate", type=float, default=1.0, help="live requests/s")
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--output-tokens", type=int, default=128)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_phase_args(ap)
    ap.add_argument("--sim-rate", type=float, default=100.0, help="the simulated fleet's requests/s")
    args = ap.parse_args()
    rows = []
    with app_server() as server, browser_page() as page:
        page.goto(server.base_url + "/lab")
        page.wait_for_function("window.servelab && window.servelab.snapshots > 0", timeout=60_000)
        for i in range(args.rounds):
            for name in ("A", "B"):
                set_levers(page, FLEET_64 | {"request_rate": args.sim_rate} if name == "B" else {"executor": "live"})
                page.wait_for_function(f"window.servelab.lab.executor === '{'sim' if name == 'B' else 'live'}'")
                rows.append({"phase": name, "round": i} | phase(server, args, seed=i))  # same traffic in A and B
                print(json.dumps(rows[-1]), flush=True)
        set_levers(page, {"executor": "live"})
    mean = {n: sum(r["mean_step_ms"] for r in rows if r["phase"] == n) / args.rounds for n in ("A", "B")}
    print(
        json.dumps(
            {
                "A_mean_step_ms": round(mean["A"], 3),
                "B_mean_step_ms": round(mean["B"], 3),
                "ratio_B_over_A": round(mean["B"] / mean["A"], 4),
                "rounds": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
