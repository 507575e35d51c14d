"""`python -m bench.lesson_latency [--lessons 02 08] [--seconds 45]`: what a lesson's cards show.

For every scenario and failure card whose text talks about ttft or the queue, the live lab is
set to the lesson's levers plus the card's, traffic runs for --seconds, and the figures the page
charts are sampled once a second: the server's TTFT p50/p99 (from the one arrival stamp) beside
the clients' (timed at their end of the stream), queue depth and refusals. The lesson texts'
numbers are checked against this table; run it alone on the machine (latency is what it reads)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("ttft", "queue_depth", "first token")


def _cards(meta: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    cards = [(c["title"], c["levers"], c.get("watch", "")) for c in meta.get("scenarios", [])]
    cards += [(c["title"], c["levers"], c.get("expect", "")) for c in meta.get("failure_modes", [])]
    return [(title, levers) for title, levers, text in cards if any(w in text.lower() for w in WORDS)]


def _settle(lab: Any, timeout_s: float = 300.0) -> None:
    """Wait for the replicas to be serving and the last card's traffic to drain."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = lab.fleet.snapshot()
        if lab.status == "serving" and snap.queue_depth == 0 and snap.running == 0:
            return
        time.sleep(0.5)
    raise RuntimeError("the lab did not settle")


def run_card(lab: Any, levers: dict[str, Any], seconds: float) -> dict[str, Any]:
    lab.set_levers(levers, source="bench")
    _settle(lab)
    refused_before = sum(lab.fleet.router.rejected.values())
    lab.flood("start")
    rows = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(1.0)
        snap = lab.snapshot(lab.fleet.snapshot())
        rows.append(snap)
    lab.flood("stop")
    last = rows[-1]

    def top(key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return max(values) if values else None

    return {
        "ttft_p50_s": last["ttft_p50"],
        "ttft_p99_s": last["ttft_p99"],
        "client_ttft_p50_s": last["client_ttft_p50"],
        "client_ttft_p99_s": last["client_ttft_p99"],
        "queue_time_p50_s": last["queue_time_p50"],
        "itl_p99_s": last["itl_p99"],
        "max_ttft_p50_s": top("ttft_p50"),
        "queue_depth_max": top("queue_depth"),
        "queue_full_at_s": next(
            (i + 1 for i, r in enumerate(rows) if r["queue_depth"] >= lab.levers["queue_cap"]), None
        ),
        "batch_size_max": top("batch_size"),
        "refused": sum(last["rejected"].values()) - refused_before,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lesson_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lessons", nargs="*", default=["02", "08"], help="lesson numbers (file prefixes)")
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    from app import build_lab
    from web.lessons import parse_lesson

    results = []
    for number in args.lessons:
        path = next((ROOT / "lessons").glob(f"{number}-*.md"))
        lesson, errors = parse_lesson(path)
        assert lesson is not None, errors
        base = dict(lesson.meta["levers"])
        lab = build_lab(base)
        try:
            assert lab.fleet.wait_ready()
            _settle(lab)
            for title, levers in _cards(lesson.meta):
                row = {"lesson": path.name, "card": title, **run_card(lab, base | levers, args.seconds)}
                results.append(row)
                print(json.dumps(row), flush=True)
                lab.set_levers(base, source="bench")
        finally:
            lab.stop()
            lab.fleet.stop()
    print()
    print(
        "| lesson | card | server TTFT p50 / p99 s | clients' TTFT p50 / p99 s | queue time p50 s | max queue | full at | refused |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def f(v: float | None) -> str:
        return "–" if v is None else f"{v:.2f}"

    for r in results:
        print(
            f"| {r['lesson'][:2]} | {r['card']} | {f(r['ttft_p50_s'])} / {f(r['ttft_p99_s'])} | "
            f"{f(r['client_ttft_p50_s'])} / {f(r['client_ttft_p99_s'])} | {f(r['queue_time_p50_s'])} | "
            f"{r['queue_depth_max']} | {r['queue_full_at_s'] or '–'} s | {r['refused']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
