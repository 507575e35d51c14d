"""Each lesson's prediction cards against the live engine, as a page runs them: the lesson's
levers and the lab's traffic, a baseline (from an idle engine), then the card's levers, and settle_s later the
metric's mean over the last five snapshots beside its mean before (static/predict.js does the
same). Prints one line per card and whether the lesson's answer names the direction seen; the
option texts say the direction in their first word ("Rises", "Climbs", "Falls", ...; any other
word means it holds: right within FLAT of where it was, or when it moved the way no wrong option
says, since the 30 s window's percentiles are noisy at a few requests a second). A numeric card's line gives the value measured,
the one a learner's guess is scored against. A card that turns collective_timeout off asks the
learner to press Stop a rank once the group serves: this does the same, and resumes it after.
`--json FILE` keeps the lines.

    python app.py --port 5077 &
    python -m bench.predictions_live --base-url http://127.0.0.1:5077 [--steps 1 4] [--baseline-s 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import socketio

from web.lessons import LessonLibrary
from web.predictions import predict_cards

MEAN_OF = 5
FLAT = 0.2  # an answer that says the metric holds is right within +-20% of where it was
UP = ("rises", "rise", "climbs", "climb", "grows", "grow", "jumps", "doubles")
DOWN = ("falls", "fall", "halves", "shrinks", "drops", "drop", "collapses")


class Stream:
    def __init__(self, base_url: str) -> None:
        self.client = socketio.Client(reconnection=False)
        self.snaps: list[dict[str, Any]] = []
        self.initial: dict[str, Any] | None = None
        self.lock = threading.Lock()
        self.client.on("metrics", self._snap, namespace="/live")
        self.client.on("hello", self._hello, namespace="/live")
        self.client.connect(base_url, namespaces=["/live"], transports=["websocket"], wait_timeout=30)
        while self.initial is None:
            time.sleep(0.1)

    def _hello(self, msg: dict[str, Any]) -> None:
        if self.initial is None:
            self.initial = dict(msg["lab"]["levers"])

    def _snap(self, snap: dict[str, Any]) -> None:
        with self.lock:
            self.snaps.append(snap)
            del self.snaps[:-50]

    def mean(self, metric: str) -> float | None:
        with self.lock:
            values = [s[metric] for s in self.snaps if isinstance(s.get(metric), (int, float))][-MEAN_OF:]
        return statistics.fmean(values) if values else None

    def call(self, event: str, data: Any) -> dict[str, Any]:
        for _ in range(150):  # a rebuild in progress refuses with `busy`: wait for it
            try:  # a drain of a long queue (static batches, a bottomless line) can hold an answer for minutes
                ack = self.client.call(event, data, namespace="/live", timeout=300)
            except socketio.exceptions.TimeoutError:
                time.sleep(2)
                continue
            if ack.get("ok") or ack["error"].get("code") != "busy":
                break
            time.sleep(2)
        if not ack.get("ok"):
            raise RuntimeError(f"{event} {data}: {ack}")
        return ack

    def wait_serving(self, timeout_s: float = 600) -> None:
        """The lab serving with its replicas ready (a rebuild the levers began has finished)."""
        time.sleep(3)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                last = self.snaps[-1] if self.snaps else None
            if last and last["lab"]["status"] == "serving" and last.get("replicas", {}).get("ready"):
                return
            time.sleep(0.5)
        raise RuntimeError("the engine did not come back to serving")

    def wait_idle(self, timeout_s: float = 600) -> None:
        """Serving, with nothing queued or running: the last card's requests are gone."""
        time.sleep(3)  # a rebuild the levers began shows in the next snapshots
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                last = self.snaps[-1] if self.snaps else None
            ready = last and last["lab"]["status"] == "serving" and last.get("replicas", {}).get("ready")
            if ready and last["queue_depth"] == 0 and last["running"] == 0 and last["waiting"] == 0:
                return
            time.sleep(0.5)
        raise RuntimeError("the engine did not come back to serving and idle")


def direction(text: str) -> str:
    word = text.split(":")[0].split()[0].lower().strip(",.")
    return "up" if word in UP else "down" if word in DOWN else "flat"


def agrees(expected: str, before: float | None, after: float | None, others: set[str]) -> bool:
    """The answer names what happened: its direction, or (an answer that the metric holds) a move
    within FLAT, or one that no wrong option claims (it stayed far from what they predict)."""
    if before is None or after is None:
        return False
    seen = "up" if after > before else "down" if after < before else "flat"
    if expected == "flat":
        return abs(after - before) <= FLAT * max(abs(before), 1e-9) or seen not in others
    return seen == expected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--steps", type=int, nargs="*", default=[lesson.step for lesson in LessonLibrary().lessons()])
    parser.add_argument("--baseline-s", type=float, default=15.0)
    parser.add_argument("--cards", nargs="*", help="only the cards with these titles")
    parser.add_argument("--json", type=Path, help="write every card's line here too")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    stream = Stream(args.base_url)
    initial = {k: v for k, v in (stream.initial or {}).items() if k not in ("executor", "device", "sim_speed")}
    library, wrong = LessonLibrary(), 0
    for step in args.steps:
        lesson = library.step(step)
        for card in predict_cards(lesson.meta):  # type: ignore[union-attr]
            if args.cards and card.title not in args.cards:
                continue
            stream.call("flood", {"action": "stop"})
            stream.call("set_levers", initial | lesson.meta["levers"])  # type: ignore[union-attr]
            stream.wait_idle()
            stream.call("flood", {"action": "start"})
            time.sleep(args.baseline_s)
            before = stream.mean(card.metric)
            stream.call("scenario", {"step": step, "kind": card.kind, "index": card.index})
            levers = lesson.meta[card.kind][card.index]["levers"]  # type: ignore[union-attr]
            hang = "collective_timeout" in levers  # the card asks the learner to press Stop a rank once it serves
            if hang:
                stream.wait_serving()
                stream.call("hang_rank", {"action": "stop"})
            time.sleep(card.settle_s)
            after = stream.mean(card.metric)
            if hang:
                stream.call("hang_rank", {"action": "resume"})
            row = {"step": step, "card": card.title, "metric": card.metric, "before": before, "after": after}
            if card.tolerance is not None:  # a number: the learner's guess is scored against `after`
                row |= {"kind": "number", "tolerance": card.tolerance, "ok": after is not None}
                print(f"step {step} {card.title!r}: {card.metric} {before} -> {after} (a number, +-{card.tolerance:.0%})", flush=True)
            else:
                expected = direction(card.options[card.answer])
                others = {direction(o) for i, o in enumerate(card.options) if i != card.answer}
                row |= {"kind": "choice", "answer_says": expected, "ok": agrees(expected, before, after, others)}
                print(f"step {step} {card.title!r}: {card.metric} {before} -> {after} "
                      f"(answer says {expected}) {'OK' if row['ok'] else 'CHECK'}", flush=True)  # fmt: skip
            wrong += not row["ok"]
            rows.append(row)
    stream.call("flood", {"action": "stop"})
    stream.call("set_levers", initial)
    stream.client.disconnect()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
