"""A decode step alone and beside one busy neighbour process (`while True: pass`, standing in for
the browser that draws the charts on a learner's 2-core laptop), at batch 1 and 8.

    python -m bench.neighbour_bench [--isa avx2] [--steps 40] [--modes adaptive,fixed]

Each row runs in a fresh process (the thread settings and SERVELAB_CPU_ISA are read at start):
`adaptive` is the engine as it ships (engine/platform/threads.py fits its threads to the cores others
leave), `fixed` keeps torch's thread count whatever happens, `passive` is fixed with
OMP_WAIT_POLICY=PASSIVE. The ratio beside / alone is the figure: losing one core of two should
cost a step at most 2x. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = {
    "adaptive": ({}, True),
    "fixed": ({}, False),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, False),
}


def measure(batch: int, steps: int, adaptive: bool) -> dict:
    """In this process: median decode step time at `batch`, alone then beside a busy process."""
    from engine import LLM, SamplingParams

    llm = LLM(max_num_seqs=max(batch, 8), adaptive_threads=adaptive, prefix_caching=False)
    engine = llm.engine
    out = {"dtype": engine.config.dtype, "plan": engine.plan.attention if engine.plan else None}
    for label in ("alone", "beside"):
        hog = None
        if label == "beside":
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(1.0)
        for i in range(batch):
            params = SamplingParams(temperature=0, max_tokens=steps + 20, ignore_eos=True)
            engine.add_request(f"{label}-{i}", None, params, prompt_token_ids=list(range(1, 33)))
        times = []
        while engine.has_work():
            start = time.perf_counter()
            engine.step()
            took = time.perf_counter() - start
            if len(engine.last_batch.seqs) == batch and all(n == 1 for n in engine.last_batch.num_new_tokens):
                times.append(took)
        if hog is not None:
            hog.kill()
            hog.wait()
        settled = times[10:] or times  # the governor's first reading comes 0.25 s in
        out[label] = statistics.median(settled) * 1000
        governor = engine.runner.governor
        out[f"{label}_threads"] = governor.threads if governor is not None else None
    out["ratio"] = out["beside"] / out["alone"]
    return out


def run_row(mode: str, batch: int, steps: int, isa: str | None) -> dict:
    env_extra, adaptive = MODES[mode]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    if isa:
        env["SERVELAB_CPU_ISA"] = isa
    code = f"import json; from bench.neighbour_bench import measure; print(json.dumps(measure({batch}, {steps}, {adaptive})))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", default=None, help="SERVELAB_CPU_ISA for the engine (e.g. avx2)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--modes", default="adaptive,fixed,passive")
    args = parser.parse_args()
    print(f"isa {args.isa or 'native'}; median decode step (ms) alone and beside one busy process")
    print(f"{'mode':9} {'batch':>5} {'dtype':>9} {'alone':>8} {'beside':>8} {'ratio':>6}  threads alone/beside")
    for mode in args.modes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            r = run_row(mode, batch, args.steps, args.isa)
            print(f"{mode:9} {batch:>5} {r['dtype']:>9} {r['alone']:8.1f} {r['beside']:8.1f} {r['ratio']:6.2f}  "
                  f"{r['alone_threads']}/{r['beside_threads']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
