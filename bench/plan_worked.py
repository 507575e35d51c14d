"""The planner's worked example (issue 29): Llama-3.1-70B at 20 req/s, 1,000/250 tokens (+-20%),
TTFT p99 <= 1 s, TPOT p99 <= 50 ms, on H100s, H200s and B200s (at most 64 GPUs, the default
prices). Times the search on every core, writes bench/results/plan_70b.json (the search, the
verdict, the frontier, the confirmation and the launch commands), prints BENCHMARKS.md's table,
and with --screenshot draws the frontier on the Plan page itself (`python app.py`, Debian's
chromium) into bench/screenshots/plan-70b.png.

    python -m bench.plan_worked [--screenshot]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.sim.plan import run_plan
from engine.sim.plan_space import PlanQuery

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "bench" / "results" / "plan_70b.json"
SCREENSHOT = ROOT / "bench" / "screenshots" / "plan-70b.png"
QUERY = PlanQuery(
    model="llama-3.1-70b", rate=20.0, input_tokens=1000, output_tokens=250, input_range_ratio=0.2,
    ttft_slo_ms=1000, tpot_slo_ms=50,
)  # fmt: skip


def table(plan: dict) -> str:
    rows = [
        "| tok/s/GPU | tok/s/user | TTFT p99 | TPOT p99 | $/M tokens | shape |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for p in plan["frontier"]:
        stages = f" x PP{p['pp']}" if p["pp"] > 1 else ""
        split = f", {p['prefill_replicas']} prefill + {p['replicas'] - p['prefill_replicas']} decode" if p["prefill_replicas"] else ""
        rows.append(
            f"| {p['output_tok_s_per_gpu']:,.0f} | {p['tok_s_per_user']:.1f} | {p['ttft_p99_s'] * 1000:,.0f} ms | "
            f"{p['tpot_p99_s'] * 1000:.1f} ms | {p['usd_per_m_tokens']:.3f} | {p['replicas']} x TP{p['tp']}{stages} on "
            f"{p['gpus']} {p['device']} {p['dtype']}{split}, {p['max_num_seqs']} slots |"
        )
    return "\n".join(rows)


def screenshot() -> None:
    """The Plan page's own chart of the same query (its search runs in the app's what-if worker)."""
    from playwright.sync_api import sync_playwright

    from tests.support.server_process import ServerProcess

    server = ServerProcess(command=("app.py",))
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium")
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(f"{server.base_url}/plan")
            page.locator("#plan-run").click()  # the page's defaults are this query
            page.wait_for_function("window.servelabPlan.plan !== null", timeout=900_000)
            page.evaluate("window.scrollTo(0, 0)")  # the Plan button scrolled it: the sticky nav would sit mid-picture
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            browser.close()
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--screenshot", action="store_true")
    args = ap.parse_args()
    plan = run_plan(QUERY).to_json()
    keep = {k: plan[k] for k in ("query", "search", "verdict", "feasible", "cheapest", "closest", "frontier")}
    RESULT.write_text(json.dumps(keep, indent=1) + "\n")
    s = plan["search"]
    print(f"{s['evaluated']} shapes simulated on {s['lines']} lines in {s['wall_s']:.1f} s "
          f"({s['enumerated']} enumerated, {s['unfit']} do not fit, {s['too_slow_by_bound']} too slow by the bound)")
    print(plan["verdict"])
    print(table(plan))
    chosen = plan["cheapest"] or plan["closest"]
    for server in ("vllm", "sglang"):
        for entry in chosen["launch"][server]:
            print(f"{server} ({entry['role']}): {entry['command']}")
    if args.screenshot:
        screenshot()


if __name__ == "__main__":
    main()
