"""`python -m bench.sim_vs_live [--quick]` (`make sim-vs-live`): the what-if `cpu` device against
the live engine on this machine, in one run (issue 12).

- offline: the engine bench's workload (bench/workload.py: 64 requests, prompts 50-400 tokens,
  128 output tokens each, all at once) through the live LLMEngine with the engine bench's levers
  (max_num_seqs 64, max_batched_tokens 2048, prefix caching on, block size 16); figures from the
  engine's RequestTimes;
- serving: `python -m engine serve --replicas 1` (as bench/serving_bench.py starts it) driven by
  our load generator at Poisson 1 and 4 req/s, the serving bench's lengths (225 +- 78% prompt,
  128 +- 78% output tokens, ignore_eos), --seconds of arrivals each; figures as the client sees them;
- the simulator (`engine.sim.run.simulate`) on exactly those requests: the same arrival times,
  prompt and output lengths, and levers.

Output tok/s, median TTFT and median TPOT, live against simulated (goal: each within +-15%).
The live runs use the execution configuration the calibration measured (attention path,
compile, threads, allocator: the calibration in use, engine/sim/calibration.py), re-executing this script with the
calibration's LD_PRELOAD if it differs. Prints a markdown table; writes bench/results/
sim_vs_live.json (.cache/sim_vs_live_quick.json with --quick). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.workload import OUTPUT_TOKENS, make_workload

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# The engine bench's ServeLab row (bench/engine_bench.py); block size and memory cap are defaults.
LEVERS: dict[str, Any] = {"max_num_seqs": 64, "max_batched_tokens": 2048, "prefix_caching": True, "block_size": 16}
RATES = (1.0, 4.0)
# The serving bench's shape (bench/serving_bench.py WORKLOAD): one range ratio for both lengths.
SERVE_PROMPT, SERVE_OUTPUT, SERVE_RATIO = 225, 128, 0.78
GOAL = 0.15
# What the calibration records of how it ran (bench/calibrate.py execution()); the live runs repeat it.
EXECUTION_KEYS = ("attention_impl", "compile", "num_threads", "ld_preload")

Workload = list[tuple[float, int, int]]  # (arrival offset s, prompt tokens, output tokens)


# the configuration the calibration measured ----------------------------------------------------


def calibrated_execution() -> dict[str, Any]:
    """The calibration's execution settings; exits when the file predates their recording."""
    from engine.sim import calibration

    found = calibration.load()
    if found is None:
        sys.exit("no calibration: run `make calibrate`")
    if not found.this_machine:
        print(f"warning: the calibration is another machine's ({'; '.join(found.differences)}): run `make calibrate`")
    fit = found.data
    engine = fit.get("engine", {})
    missing = [k for k in EXECUTION_KEYS if k not in engine]
    if missing:
        sys.exit(f"the calibration of {fit.get('date')} does not record {', '.join(missing)}: run `make calibrate`")
    exe = {k: engine[k] for k in EXECUTION_KEYS}
    exe |= {"date": fit.get("date"), "memory_gb": fit["device"]["memory_gb"], "dtype": engine.get("dtype")}
    return exe


def match_allocator(exe: dict[str, Any], argv: list[str]) -> None:
    """LD_PRELOAD only acts at process start: re-run this script under the calibration's."""
    want, have = exe["ld_preload"], os.environ.get("LD_PRELOAD", "")
    if want == have or os.environ.get("SIM_VS_LIVE_REEXEC"):
        return
    if want and not all(Path(p).exists() for p in want.split(":")):
        print(f"warning: the calibration preloaded {want!r}, which is not here; running with {have!r}")
        return
    env = {**os.environ, "LD_PRELOAD": want, "SIM_VS_LIVE_REEXEC": "1"}
    if not want:
        env.pop("LD_PRELOAD")
    print(f"re-running with LD_PRELOAD={want!r} (the calibration's)", flush=True)
    os.execve(sys.executable, [sys.executable, "-m", "bench.sim_vs_live", *argv], env)


def select_attention(exe: dict[str, Any]) -> None:
    """The server's replica picks its path by environment; the offline engine is set directly."""
    if exe["attention_impl"] == "torch":
        os.environ["SERVELAB_CPU_KERNELS"] = "0"
        return
    os.environ.pop("SERVELAB_CPU_KERNELS", None)
    from engine.kernels import cpu_attention

    if not cpu_attention.available():
        sys.exit("the calibration ran the C++ attention op, which is not built here: run `make kernels`")


# workloads --------------------------------------------------------------------------------------


def offline_workload(num_requests: int, output_tokens: int) -> tuple[list[list[int]], Workload]:
    reqs = make_workload(num_requests=num_requests, output_tokens=output_tokens)
    return [r["prompt_token_ids"] for r in reqs], [(0.0, len(r["prompt_token_ids"]), output_tokens) for r in reqs]


def serving_workload(rate: float, seconds: float, output_mean: int, seed: int) -> tuple[list[Any], Workload]:
    """One rate's requests. Each rate takes its own seed: the server keeps its prefix cache from
    one rate to the next, and the same seed draws the same first prompts, which the next run
    would then find cached (the simulator starts each run cold)."""
    from engine.serving.load.loadgen import arrival_times, make_requests

    n = max(2, round(rate * seconds))
    reqs = make_requests(n, SERVE_PROMPT, output_mean, SERVE_RATIO, seed)
    arrivals = arrival_times(rate, n, 1.0, seed)
    return reqs, [(a, len(r.prompt_token_ids), r.max_tokens) for a, r in zip(arrivals, reqs)]


# live -------------------------------------------------------------------------------------------


def live_offline(prompts: list[list[int]], output_tokens: int, exe: dict[str, Any]) -> dict[str, Any]:
    from engine import LLM, SamplingParams

    llm = LLM(dtype="bfloat16", compile=exe["compile"], num_threads=exe["num_threads"], **LEVERS)
    engine = llm.engine
    assert engine.model is not None
    engine.model.attention_impl = exe["attention_impl"]
    warm = make_workload(num_requests=8, output_tokens=8, seed=1)
    llm.generate(warm, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    start = time.perf_counter()
    seqs = [engine.add_request(f"off-{i}", None, params, prompt_token_ids=p) for i, p in enumerate(prompts)]
    while engine.has_work():
        engine.step()
    seconds = time.perf_counter() - start
    tokens = sum(len(s.output_token_ids) for s in seqs)
    return {
        "output_tok_s": tokens / seconds,
        "ttft_p50_s": statistics.median(s.times.ttft for s in seqs),  # type: ignore[type-var]
        "tpot_p50_s": statistics.median(s.times.tpot for s in seqs),  # type: ignore[type-var]
        "seconds": seconds,
        "output_tokens": tokens,
        "preemptions": engine.scheduler.num_preemptions,
        "steps": engine.num_steps,
        "kv_blocks": engine.kv.num_blocks,
        "torch_threads": _torch_threads(),
    }


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, exe: dict[str, Any], log: Path) -> subprocess.Popen:
    from bench.serving_bench import wait_http

    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # carries LD_PRELOAD and SERVELAB_CPU_KERNELS
    flags = [f"--{k.replace('_', '-')}={str(v).lower()}" for k, v in LEVERS.items()]
    cmd = [sys.executable, "-m", "engine", "serve", "--port", str(port), "--replicas", "1", *flags,
           "--queue-cap", "4096", "--deadline-s", "3600", "--compile", str(exe["compile"]).lower()]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    wait_http(port, "/ready", proc)
    return proc


def live_serving(port: int, reqs: list[Any], workload: Workload) -> dict[str, Any]:
    from engine.model.paths import DEFAULT_MODEL_NAME
    from engine.serving.load.loadgen import HttpTarget, run_load
    from engine.serving.load.loadgen_metrics import summarize

    target = HttpTarget(f"http://127.0.0.1:{port}", DEFAULT_MODEL_NAME)
    arrivals = [a for a, _, _ in workload]
    started = time.perf_counter()
    records = run_load(target, reqs, arrivals, max_duration_s=900)
    s = summarize(records, time.perf_counter() - started)
    if s["completed"] != len(reqs):
        raise RuntimeError(f"{len(reqs) - s['completed']} requests did not complete: {s['errors']}")
    return {
        "output_tok_s": s["output_throughput"],
        "ttft_p50_s": s["median_ttft_ms"] / 1000,
        "tpot_p50_s": s["median_tpot_ms"] / 1000,
        "seconds": s["duration_s"],
        "output_tokens": s["total_output_tokens"],
    }


# simulated --------------------------------------------------------------------------------------


def simulated(workload: Workload, rate: float, through_server: bool) -> dict[str, Any]:
    """through_server: the live figures came through the HTTP server, whose front and clients
    share these cores (the front costs `make calibrate` measured: SimSpec.front_on_device)."""
    from engine.config import EngineConfig
    from engine.sim.run import SimSpec, simulate
    from engine.sim.workload import SimRequest

    # SimSpec carries no block size: the engine's default is the one the live run uses.
    assert LEVERS["block_size"] == EngineConfig.block_size
    requests = [SimRequest(str(i), a, p, o) for i, (a, p, o) in enumerate(workload)]
    spec = SimSpec(
        model="smollm2-135m", device="cpu", gpus=1, tp=1, dtype="bf16", kv_dtype="bf16",
        input_tokens=max(p for _, p, _ in workload), output_tokens=max(o for _, _, o in workload),
        num_requests=len(workload), rate=rate, max_num_seqs=LEVERS["max_num_seqs"],
        max_batched_tokens=LEVERS["max_batched_tokens"], prefix_caching=LEVERS["prefix_caching"], seed=0,
        front_on_device=through_server,
    )  # fmt: skip
    r = simulate(spec, requests)
    keys = ("output_tok_s", "ttft_p50_s", "tpot_p50_s", "simulated_s", "preemptions", "steps",
            "kv_blocks_per_replica", "completed", "wall_s")  # fmt: skip
    return {k: r[k] for k in keys}


# the run ----------------------------------------------------------------------------------------

METRICS = (("output_tok_s", "output tok/s", 1.0, "{:.1f}"), ("ttft_p50_s", "median TTFT ms", 1000.0, "{:.1f}"),
           ("tpot_p50_s", "median TPOT ms", 1000.0, "{:.2f}"))  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | metric | live | sim | error | within 15% |", "|---|---|---:|---:|---:|---|"]
    for row in rows:
        for key, label, scale, fmt in METRICS:
            live, sim = row["live"][key], row["sim"][key]
            err = sim / live - 1 if live else float("nan")
            row.setdefault("error", {})[key] = err
            ok = "yes" if abs(err) <= GOAL else "no"
            live_s, sim_s = fmt.format(live * scale), fmt.format(sim * scale)
            lines.append(f"| {row['workload']} | {label} | {live_s} | {sim_s} | {err * 100:+.1f}% | {ok} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.sim_vs_live", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run: a few requests, short outputs")
    parser.add_argument("--seconds", type=float, default=60.0, help="arrivals per Poisson rate (default 60)")
    parser.add_argument("--offline-requests", type=int, default=64)
    args = parser.parse_args(argv)
    exe = calibrated_execution()
    match_allocator(exe, argv)
    select_attention(exe)
    n_off, out_off, seconds, serve_out = args.offline_requests, OUTPUT_TOKENS, args.seconds, SERVE_OUTPUT
    if args.quick:
        n_off, out_off, seconds, serve_out = 8, 16, 4.0, 16

    notes = []
    from engine.config import EngineConfig
    from engine.platform.machine import usable_cores

    cores = usable_cores()  # the server's one replica runs a thread per core it owns
    if exe["num_threads"] not in (None, cores):
        notes.append(f"the calibration ran {exe['num_threads']} threads; the server's replica runs {cores}")
    if exe["memory_gb"] * 1024 != EngineConfig.memory_cap_mb:
        notes.append(f"the calibration's memory cap {exe['memory_gb']} GB is not the live default")
    print(f"live execution (the calibration's): attention {exe['attention_impl']}, compile {exe['compile']}, "
          f"threads {exe['num_threads'] or 'torch default'}, LD_PRELOAD {os.environ.get('LD_PRELOAD', '')!r}; "
          f"levers {LEVERS}", flush=True)  # fmt: skip
    for note in notes:
        print(f"note: {note}", flush=True)

    rows: list[dict[str, Any]] = []
    prompts, workload = offline_workload(n_off, out_off)
    print(f"offline: {n_off} requests, prompts 50-400 tokens, {out_off} output tokens, all at once", flush=True)
    live = live_offline(prompts, out_off, exe)
    rows.append({"workload": "offline (engine bench)", "requests": n_off, "live": live,
                 "sim": simulated(workload, float("inf"), False)})  # fmt: skip
    print(f"  live {live['output_tok_s']:.1f} tok/s in {live['seconds']:.1f} s", flush=True)

    RESULTS.mkdir(parents=True, exist_ok=True)
    log = ROOT / ".cache" / "sim-vs-live-server.log"
    log.parent.mkdir(exist_ok=True)
    port = free_port()
    from bench.serving_bench import stop

    proc = start_server(port, exe, log)
    try:
        from engine.serving.load.loadgen import make_requests

        live_serving(port, make_requests(4, 64, 8, seed=99), [(0.0, 64, 8)] * 4)  # warm the server's paths
        for i, rate in enumerate(RATES):
            reqs, workload = serving_workload(rate, seconds, serve_out, seed=1 + i)
            print(f"serving: Poisson {rate:g} req/s, {len(reqs)} requests", flush=True)
            live = live_serving(port, reqs, workload)
            rows.append({"workload": f"serving, Poisson {rate:g} req/s", "requests": len(reqs), "live": live,
                         "sim": simulated(workload, rate, True)})  # fmt: skip
            print(f"  live {live['output_tok_s']:.1f} tok/s in {live['seconds']:.1f} s", flush=True)
    finally:
        stop(proc)

    text = table(rows)
    print()
    print(text)
    worst = max(abs(e) for row in rows for e in row["error"].values())
    print(f"\nworst error {worst * 100:.1f}% (goal: every figure within {GOAL * 100:.0f}%)"
          + (" [--quick: a smoke run, not a measurement]" if args.quick else ""))  # fmt: skip
    # A smoke run is no result of record: it goes to .cache, not bench/results.
    out = ROOT / ".cache" / "sim_vs_live_quick.json" if args.quick else RESULTS / "sim_vs_live.json"
    out.write_text(json.dumps({
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.sim_vs_live" + (" --quick" if args.quick else ""),
        "load_average": list(os.getloadavg()), "execution": exe, "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "levers": LEVERS, "notes": notes, "rows": rows, "worst_error": worst, "table": text,
    }, indent=2, default=str) + "\n")  # fmt: skip
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
