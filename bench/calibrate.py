"""`make calibrate`: fit the what-if `cpu` device to this machine's live engine.

Times the live engine's own steps (SmolLM2-135M, dtype auto, this machine's cores) on a grid of
shapes (batch x prompt length, chunked prefill), records each step's shape exactly as the cost
model's runner reads it (engine/sim/runner.py step_shape), and fits the device's constants
(achieved FLOP/s, achieved bandwidth, attention efficiency, per-step overhead, host time per
sampled row) by minimising the squared log error of the cost model's prediction over every step
(Nelder-Mead, numpy only).
Writes this machine's calibration to .cache/calibration/<key>.json (engine/sim/calibration.py:
keyed on the CPU, its ISA tier, the dtype, the threads and the step code's hash) with the date,
the command, the fit error and the execution configuration it measured (attention path, compile,
threads, allocator), which bench/sim_vs_live.py reproduces for its live runs. `--reference` also
makes it the committed reference (engine/sim/cpu_calibration.json), which other machines use
named as foreign until they calibrate.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
from typing import Any

import numpy as np

from engine.config import EngineConfig
from engine.core.memory import MemoryPlan
from engine.launch.served import served_levers
from engine.platform.host_load import ConditionMeter, count_pauses
from engine.sim import calibration
from engine.sim.cost_model import CostModel, StepShape
from engine.sim.deployment import Deployment
from engine.sim.devices import CPU_CALIBRATION, Device
from engine.sim.models import get_model
from engine.sim.runner import step_shape

# (requests, prompt tokens): decode batches from 1 to 64 at short and long contexts (64: the
# engine bench's batch, which bench/sim_vs_live.py compares); single prompts of 32 to 512 tokens
# (a serving run's prefills) and chunked prefill of the long prompts give compute-heavy steps.
GRID = [(1, 32), (1, 128), (1, 256), (1, 512), (4, 128), (8, 512), (16, 64), (16, 384), (32, 128), (32, 256),
        (64, 256)]  # fmt: skip
OUTPUT_TOKENS = 16
REPEATS = 3
MIN_STEPS = 20  # a fit over fewer timed steps is not one
MAX_RUNS = 6  # the grid's runs at most, paused ones included
REFUSED_EXIT = 3  # the exit status of a fit not kept: engine/launch/yielding.py tries again later
IDS = itertools.count()


def measure(
    config: EngineConfig, repeats: int = REPEATS, meter: ConditionMeter | None = None
) -> tuple[list[tuple[StepShape, float]], MemoryPlan, dict]:
    """Every step of the grid, `repeats` times over (the scheduler is deterministic, so the i-th
    step has the same shape each time); the median of each is kept: the simulator predicts the
    steps a serving run lives with, and the fastest of three (the fit before) described the best
    case: 33 ms against a typical 41 ms at 1 req/s (BENCHMARKS.md, the simulator against live).
    A step a pause fell inside (the live engine had work: engine/launch/yielding.py) is not a
    timing; the grid runs again, up to MAX_RUNS in all, until each step has `repeats` clean ones.
    The meter records what else ran meanwhile (engine/platform/host_load.py)."""
    from engine.core.llm_engine import LLMEngine

    meter = meter or ConditionMeter()
    engine = LLMEngine(config)
    runs = [_grid_steps(engine, meter)]
    clean = [[t] if t is not None else [] for _, t in runs[0]]
    while len(runs) < MAX_RUNS and any(len(times) < repeats for times in clean):
        runs.append(_grid_steps(engine, meter))
        for times, (_, t) in zip(clean, runs[-1], strict=True):
            if t is not None:
                times.append(t)
    for times in clean:
        meter.repeated(times)
    samples = [(shape, statistics.median(times)) for (shape, _), times in zip(runs[0], clean, strict=True) if times]
    return samples, engine.memory, execution(engine)


def execution(engine: Any) -> dict[str, Any]:
    """What decides a step's speed besides its shape: the live comparison must run the same."""
    import torch

    from engine.kernels import pick_impl

    model = engine.model
    return {"attention_impl": pick_impl(model.attention_impl, model.embed), "compile": engine.config.compile,
            "num_threads": torch.get_num_threads(), "ld_preload": os.environ.get("LD_PRELOAD", ""),
            "torch": torch.__version__, "python": sys.version.split()[0]}


def _grid_steps(engine: Any, meter: ConditionMeter) -> list[tuple[StepShape, float | None]]:
    """One run of the grid: each step's shape and time, None where a pause fell inside it."""
    from engine.sampling_params import SamplingParams

    samples = []
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    for run, (n, length) in enumerate(GRID):
        for i in range(n):
            ids = [rng.randrange(100, 49000) for _ in range(length)]
            engine.add_request(f"cal-{next(IDS)}", None, params, prompt_token_ids=ids)
        # Each run's first step is its prompts' prefill: 32 to 1,024 tokens, the prefills a
        # serving run lives on (a 225-token prompt at 1 req/s). Left out, the fit saw only the
        # 2,048-token chunks and put single prompts 14-16% short (the simulator's TTFT at 1 req/s,
        # BENCHMARKS.md). Cold caches in the first repeat are what the median of three is for.
        while engine.has_work():
            with meter.window() as kept:
                start = time.perf_counter()
                _, batch = engine.begin_step()
                if not batch.seqs:
                    continue
                shape, _ = step_shape(batch)
                engine.end_step(batch, engine.runner.execute(batch))
                elapsed = time.perf_counter() - start
            samples.append((shape, elapsed if kept() else None))
    return samples


def device(values: np.ndarray, memory_gb: float) -> Device:
    flops, bw, attn, step, row = (float(v) for v in np.exp(values))
    attn = min(max(attn, 0.02), 1.0)  # a fraction of the GEMM rate, kept physical
    return Device("cpu", memory_gb, int(memory_gb * 2**30), bw, {"bf16": flops}, 0.0, gemm_efficiency=1.0,
                  attention_efficiency=attn, bw_efficiency=1.0, step_overhead_s=step, layer_overhead_s=0.0,
                  sample_overhead_s=0.0, token_overhead_s=row, gemm_overlaps_memory=False, runtime_reserve_bytes=0,
                  gpus_per_node=1, kv_free_fraction=1.0, activation_bytes=4)


def loss(values: np.ndarray, samples: list, memory_gb: float) -> float:
    model = CostModel(Deployment(get_model("smollm2-135m"), device(values, memory_gb)))
    return sum(math.log(model.step(shape).total_s / t) ** 2 for shape, t in samples) / len(samples)


def nelder_mead(f, x0: np.ndarray, steps: int = 600, scale: float = 0.5) -> np.ndarray:
    simplex = [x0] + [x0 + scale * np.eye(len(x0))[i] for i in range(len(x0))]
    values = [f(x) for x in simplex]
    for _ in range(steps):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink toward the best
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def main() -> int:
    # No prefix caching: a repeat of the grid must compute every step again, not hit the cache.
    # dtype "auto": what `make run` serves on this machine (bf16 with native bf16, else fp32).
    # Threads fixed at what the engine starts with: a fit over a changing count describes none.
    # The engine as served (engine/launch/served.py: compiled, huge pages), the fit's subject.
    config = EngineConfig(
        **served_levers(), max_num_seqs=64, max_batched_tokens=512, prefix_caching=False, adaptive_threads=False
    )
    count_pauses()  # `make run`'s background run is paused while the live engine serves
    if "--background" in sys.argv:  # `make run`'s (app.py): only the cycles the live engine leaves
        os.nice(19)
        if sys.platform == "linux":
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    marker = calibration.running_marker(calibration.this_machine(config.dtype))
    marker.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    marker.write_text(json.dumps({"pid": os.getpid(), "started": started}))  # the predict panel says so
    try:
        kept = fit_and_write(config)
    finally:
        marker.unlink(missing_ok=True)
    if not kept:
        return REFUSED_EXIT
    if "--then-figures" in sys.argv:  # make run's first start: the lessons' offline figures next, as low
        from bench import figures

        return figures.main(["--background"])
    return 0


def fit_and_write(config: EngineConfig, meter: ConditionMeter | None = None) -> bool:
    """Measure, fit, and keep the fit as this machine's if it was measured within the bounds
    (engine/platform/host_load.py); else record why it was refused and keep nothing. True if kept."""
    meter = meter or ConditionMeter()
    samples, memory, run_config = measure(config, meter=meter)
    if len(samples) < MIN_STEPS:  # nothing to fit: every run of the grid was paused partway
        reason = f"only {len(samples)} steps timed without a pause (at least {MIN_STEPS})"
        key = calibration.this_machine(config.dtype, run_config["num_threads"])
        result = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                  "conditions": meter.conditions().to_json()}  # fmt: skip
        print(f"not kept: {reason}; {calibration.write_refusal(result, reason, key)}", file=sys.stderr)
        return False
    memory_gb = config.memory_cap_mb / 1024
    x0 = np.log([5e10, 1e10, 0.3, 2e-3, 2e-5])
    fit = nelder_mead(lambda x: loss(x, samples, memory_gb), x0)
    dev = device(fit, memory_gb)
    model = CostModel(Deployment(get_model("smollm2-135m"), dev))
    errors = [model.step(s).total_s / t - 1 for s, t in samples]
    conditions = meter.conditions()
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "make calibrate  (python -m bench.calibrate)",
        "engine": {"model": "smollm2-135m", "dtype": config.dtype, "max_num_seqs": config.max_num_seqs,
                   "max_batched_tokens": config.max_batched_tokens, "block_size": config.block_size,
                   "prefix_caching": config.prefix_caching, "kv_blocks_live": memory.num_blocks, **run_config},
        "steps_timed": len(samples),
        "repeats": REPEATS,
        "load_average": list(os.getloadavg()),  # other work on the machine while it was timed
        "conditions": conditions.to_json(),
        "median_abs_error": float(np.median(np.abs(errors))),
        "p90_abs_error": float(np.percentile(np.abs(errors), 90)),
        "device": {"memory_gb": memory_gb, "flops": dev.peak_flops["bf16"], "mem_bw": dev.mem_bw,
                   "attention_efficiency": dev.attention_efficiency, "step_overhead_s": dev.step_overhead_s,
                   "layer_overhead_s": 0.0, "sample_overhead_s": 0.0, "token_overhead_s": dev.token_overhead_s,
                   "gemm_overlaps_memory": dev.gemm_overlaps_memory},
    }
    key = calibration.this_machine(config.dtype, run_config["num_threads"])
    result["engine"]["dtype"] = key.dtype  # what "auto" resolved to here
    print(json.dumps(result, indent=2))
    refusal = conditions.refusal(result["median_abs_error"])
    if refusal is not None:
        print(f"not kept: {refusal}; {calibration.write_refusal(result, refusal, key)} says so, and a quiet machine's"
              " run replaces it", file=sys.stderr)  # fmt: skip
        return False
    print(f"this machine's calibration: {calibration.write(result, key)}")
    if "--reference" in sys.argv:  # the committed reference machine's, which other machines name as foreign
        calibration.write(result, key, directory=CPU_CALIBRATION.parent).rename(CPU_CALIBRATION)
        print(f"and the reference: {CPU_CALIBRATION}")
    return True


if __name__ == "__main__":
    sys.exit(main())
