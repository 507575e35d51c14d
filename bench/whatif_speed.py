"""`python -m bench.whatif_speed`: how long the browser waits for each what-if run, on this
machine: every A/B preset and every lesson's at-scale experiment, both sides, through the same
code as `POST /whatif/ab` (engine/sim/compare.py), plus the live lab's prediction at its default
levers (engine/lab/simulated/predict.py). Prints a markdown table of wall seconds and simulated seconds."""

from __future__ import annotations

import os
import sys
import time

from engine.lab.simulated.predict import predict
from engine.levers import LEVERS
from engine.sim.compare import parse_experiment, run_experiment
from engine.sim.presets import PRESETS
from web.lessons import LessonLibrary


def main() -> int:
    runs = [(f"preset {name}", {"preset": name}) for name in PRESETS]
    for lesson in LessonLibrary().lessons():
        runs += [(f"step {lesson.step}: {run['title']}", run["experiment"]) for run in lesson.meta.get("at_scale", [])]
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| run | requests a side | simulated s (A / B) | wall s (both sides) |")
    print("|---|---:|---:|---:|")
    for name, body in runs:
        start = time.perf_counter()
        result = run_experiment(parse_experiment(body))
        wall = time.perf_counter() - start
        sims = " / ".join(f"{result[side]['summary']['simulated_s']:.0f}" for side in ("a", "b"))
        print(f"| {name} | {result['traffic']['requests']} | {sims} | {wall:.1f} |", flush=True)
    levers = {key: lever.default for key, lever in LEVERS.items()}
    start = time.perf_counter()
    out = predict(levers)
    print(f"| predict-then-run, default levers | {out['requests']} | {out['summary']['simulated_s']:.0f} | "
          f"{time.perf_counter() - start:.1f} |")  # fmt: skip
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
