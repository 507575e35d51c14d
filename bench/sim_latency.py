"""`python -m bench.sim_latency`: the what-if executor's TTFT and TPOT against published serving runs
at a known request rate (issue 29, "latency accuracy, separately").

Every row is one simulated run (engine.sim.run.simulate, the same function as `python -m engine.sim
run`) with the published run's model, GPU, tensor parallelism, dtype, Poisson rate and the engine's
own batching limits, and nothing fitted to the row: the cost model's constants are shared physics
(engine/sim/constants.py) and are not touched here. Lengths are the dataset's means under the
benchmark's own sampling, drawn uniform +-SPREAD around the mean (one spread for every row).

Sources (cite beside each number; BENCHMARKS.md "The simulator's latency against published runs"):
- sgl-project/sglang benchmark/benchmark_vllm_060/README.md: SGLang v0.3.0 and vLLM v0.6.0
  (--num-scheduler-steps 10), `python3 -m sglang.bench_serving --dataset-name sharegpt`, 1,200
  prompts at 4 req/s and 2,400 at 8 req/s; Llama 3.1 8B Instruct on 1 x A100 80G, Llama 3.1 70B
  Instruct on 4 x H100 80G (TP4), bf16; median TTFT and median TPOT.
- mlcommons/inference_results_v4.1 closed/NVIDIA/results/{DGX-H100_H100-SXM-80GBx8_TRT,
  H200-SXM-141GBx8_TRT}/llama2-70b-*/Server/performance/run_1/mlperf_log_summary.txt, with
  closed/NVIDIA/configs/llama2-70b/Server/__init__.py (H100: TP2 x 4, gpu_batch_size 1024; H200: TP1
  x 8, gpu_batch_size 896; FP8, KV at 0.90 of free memory).
- ntuhpc/mlperf_inference_results_v5.0 (a copy of mlcommons/inference_results_v5.0)
  closed/NVIDIA/results/DGX-H100_H100-SXM-80GBx8_TRT/llama2-70b-99.9/Server/performance/run_1/
  mlperf_log_summary.txt (its configuration file is not in the copy: v4.1's TP2 x 4 is assumed).

Per row the engine's policy is what the published engine ran (no constant fitted): SGLang 0.3.0 and
vLLM 0.6.0 put a prompt in a step of its own (EngineConfig.prefill_first), vLLM 0.6.0 ran ten decode
steps per schedule (scheduler_steps 10), and both served the benchmark client directly (SimSpec
central_queue False: no router in front); TensorRT-LLM's in-flight batching mixes, the default.

The MLPerf rows model a 2,400-3,600 s steady run: arrivals for --seconds, and only requests that
arrive inside the steady window [WARMUP_S, seconds - TAIL_S] count (the ramp-up and the drain are
left out, as they are a rounding error of the real run's length). Writes bench/results/sim_latency.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import engine.sim.run as sim_run
from engine.config import EngineConfig
from engine.sim.deployment import Deployment
from engine.sim.host_profiles import PROFILES
from engine.sim.results import Recorder
from engine.sim.run import SimSpec, simulate

ROOT = Path(__file__).resolve().parent.parent

# One spread for every row: ShareGPT (as the benchmarks sample it) and MLPerf's OpenOrca set both run
# from a few tokens to ~1,000 with a standard deviation about 0.8 of the mean; a uniform +-r has
# 0.577 r, so the widest the simulator takes (r < 1) is the nearest: 0.9 (0.52 of the mean).
SPREAD = 0.9

# ShareGPT V3 under `sglang.bench_serving` / `vllm bench serve` sampling (first two turns; prompt and
# completion 4+ tokens, prompt <= 1024, prompt + completion <= 2048; vllm-project/vllm
# vllm/benchmarks/datasets.py is_valid_sequence, the rule sglang v0.3's bench_serving copied from
# vLLM's benchmark_serving.py); output = the completion's length, generated with ignore_eos.
# Output mean: the README's own offline rows, 4281.51 tok/s / 22.03 req/s = 194 (8B) and
# 3856.01 / 19.84 = 194 (70B). Input mean: Llama-3 tokenizer runs of the same sampler,
# vllm-project/vllm PR 18566 (1,000 prompts, 229,711 input tokens) and kubeai-project/kubeai PR 341
# (940 prompts, 203,559): 433,270 / 1,940 = 223.
SHAREGPT_IN, SHAREGPT_OUT = 223, 194
# MLPerf llama2-70b OpenOrca (24,576 samples): input mean 222.3 tokens (openshift-psap/
# performance-dashboard mlperf-data/summaries/llama2-70b-99.csv, tok_input_length of MLCommons'
# open_orca_gpt4_tokenized_llama.sampled_24576.pkl); output = what each SUT generated, its log's
# "Completed tokens per second" / "Completed samples per second" (reference: 294.45 tokens per
# sample, mlcommons/inference language/llama2-70b/README.md).
ORCA_IN = 222

WARMUP_S, TAIL_S = 100.0, 50.0  # MLPerf rows: the steady window of the arrivals

README = "sgl-project/sglang benchmark/benchmark_vllm_060/README.md"
V41 = "mlcommons/inference_results_v4.1 closed/NVIDIA/results/{}/llama2-70b-{}/Server/performance/run_1/mlperf_log_summary.txt"
V50 = "ntuhpc/mlperf_inference_results_v5.0 closed/NVIDIA/results/{}/llama2-70b-{}/Server/performance/run_1/mlperf_log_summary.txt"


@dataclass
class Row:
    name: str
    source: str
    model: str
    device: str
    gpus: int
    tp: int
    dtype: str
    rate: float  # req/s offered (MLPerf: "Scheduled samples per second")
    num_requests: int  # README rows: the published prompt count; MLPerf rows: rate x --seconds
    input_tokens: int
    output_tokens: int
    max_num_seqs: int
    max_batched_tokens: int
    chunked_prefill: bool
    admission: str
    published: dict[str, tuple[float, float]]  # statistic -> (TTFT s, TPOT s)
    steady: bool = False  # MLPerf: count only the steady window of arrivals
    note: str = ""
    assumed: bool = False  # part of the configuration is assumed, not read from the source
    # The README's "Median ITL" (s): SGLang's is one decode step's gap; vLLM's, under ten-step runs,
    # is the gap between one run's burst of tokens and the next. None where nothing is published.
    itl_published_s: float | None = None
    kv_dtype: str | None = None
    prefill_first: bool = False  # EngineConfig.prefill_first: prompts in a step of their own
    scheduler_steps: int = 1  # EngineConfig.scheduler_steps: decode steps per schedule
    central_queue: bool = True  # SimSpec.central_queue: False, requests reach the engine on arrival
    host_profile: str = "default"  # the engine generation's host work (engine/sim/host_profiles.py)
    kv_watermark: float = 0.0  # EngineConfig.kv_watermark: vLLM v0's whole-prompt admission with blocks kept free


def _readme(model: str, device: str, gpus: int, engine: str, rate: int, ttft_ms: float, tpot_ms: float,
            itl_ms: float) -> Row:
    vllm = engine == "vLLM 0.6.0"
    size = "8B" if model.endswith("8b") else "70B"
    return Row(
        name=f"{engine}, Llama 3.1 {size}, {gpus} x {device.upper()}, {rate} req/s", source=README,
        model=model, device=device, gpus=gpus, tp=gpus, dtype="bf16", rate=float(rate),
        num_requests=300 * rate, input_tokens=SHAREGPT_IN, output_tokens=SHAREGPT_OUT,
        # vLLM 0.6.0: max_num_seqs 256; chunked prefill off below a 32K context (--max_model_len
        # 4096), so max_num_batched_tokens = max(max_model_len, 2048) = 4096 and a prompt runs whole.
        # SGLang 0.3.0: chunked_prefill_size 8192; its running-request cap is far above the ~10-60
        # requests these rates keep in flight, so the simulator's 1,024 does not bind.
        max_num_seqs=256 if vllm else 1024, max_batched_tokens=4096 if vllm else 8192,
        chunked_prefill=not vllm, admission="greedy", published={"p50": (ttft_ms / 1e3, tpot_ms / 1e3)},
        itl_published_s=itl_ms / 1e3,
        # Both ran prompts in steps of their own. vLLM 0.6.0 without chunked prefill:
        # vllm/core/scheduler.py _schedule_default, "Don't schedule decodes if prefills are
        # scheduled". SGLang 0.3.0: python/sglang/srt/server_args.py `enable_mixed_chunk: bool =
        # False`, and python/sglang/srt/managers/tp_worker.py forward_step runs a new prefill batch
        # whenever get_new_prefill_batch returns one, the decode batch only otherwise (its
        # num_continue_decode_steps = 10 stops after one step while a streamed request has output:
        # `if self.out_pyobjs and self.running_batch.has_stream(): break`, stream_interval 1).
        prefill_first=True,
        # vLLM 0.6.0 ran --num-scheduler-steps 10 (the README's command): a decode batch runs ten
        # steps per schedule (vllm/engine/llm_engine.py step: "Skip the scheduler if there are any
        # remaining steps"; a prefill gets no lookahead slots, so it is a single step).
        scheduler_steps=10 if vllm else 1,
        # One server, the benchmark client sending to it directly: no router holding a request
        # back while the engine has one waiting.
        central_queue=False,
        # The host's work per step, as measured for a 2024 Python engine (Vidur's Sarathi-Serve
        # profile): SGLang 0.3 paid it in series with the GPU; vLLM 0.6 scheduled and prepared once per
        # ten-step run and processed outputs asynchronously (its v0.6.0 post).
        host_profile="vllm-0.6-multistep" if vllm else "python-2024",
        # vLLM 0.6.0 admitted a prompt only when all of its blocks fit with 1% of the cache left free
        # (vllm/core/block_manager*.py can_allocate, BlockSpaceManager watermark=0.01).
        kv_watermark=0.01 if vllm else 0.0,
        note="--num-scheduler-steps 10: scheduler_steps 10" if vllm else "",
    )


def _mlperf(name: str, source: str, device: str, tp: int, batch: int, scheduled: float, samples: float,
            tokens: float, p50: tuple[float, float], mean: tuple[float, float], p99: tuple[float, float],
            note: str = "", assumed: bool = False) -> Row:
    def ms(pair: tuple[float, float]) -> tuple[float, float]:
        return pair[0] / 1e3, pair[1] / 1e3

    return Row(
        name=name, source=source, model="llama-2-70b", device=device, gpus=8, tp=tp, dtype="fp8", kv_dtype="fp8",
        rate=scheduled, num_requests=0, input_tokens=ORCA_IN, output_tokens=round(tokens / samples),
        # TensorRT-LLM: max batch = the config's gpu_batch_size, 8,192 tokens a step (its default
        # max_num_tokens), guaranteed-no-evict admission (bench/sim_trtllm.py's --admission reserve).
        max_num_seqs=batch, max_batched_tokens=8192, chunked_prefill=True, admission="reserve",
        published={"p50": ms(p50), "mean": ms(mean), "p99": ms(p99)}, steady=True, note=note, assumed=assumed,
    )


ROWS: list[Row] = [
    _readme("llama-3.1-8b", "a100", 1, "SGLang 0.3.0", 4, 31.98, 13.17, 11.93),
    _readme("llama-3.1-8b", "a100", 1, "vLLM 0.6.0", 4, 100.48, 14.14, 129.32),
    _readme("llama-3.1-8b", "a100", 1, "SGLang 0.3.0", 8, 35.68, 17.85, 14.41),
    _readme("llama-3.1-8b", "a100", 1, "vLLM 0.6.0", 8, 120.39, 17.09, 158.63),
    _readme("llama-3.1-70b", "h100", 4, "SGLang 0.3.0", 4, 53.94, 25.03, 21.67),
    _readme("llama-3.1-70b", "h100", 4, "vLLM 0.6.0", 4, 179.15, 23.58, 231.23),
    _readme("llama-3.1-70b", "h100", 4, "SGLang 0.3.0", 8, 58.11, 33.07, 24.45),
    _readme("llama-3.1-70b", "h100", 4, "vLLM 0.6.0", 8, 207.12, 29.15, 275.32),
    _mlperf("MLPerf v4.1 Server, TRT-LLM, 8 x H100 (TP2 x 4)", V41.format("DGX-H100_H100-SXM-80GBx8_TRT", "99.9"),
            "h100", 2, 1024, 75.10, 74.42, 21605.79, (272.95, 156.42), (275.93, 154.96), (461.28, 175.35)),
    _mlperf("MLPerf v4.1 Server, TRT-LLM, 8 x H200 (TP1 x 8)", V41.format("H200-SXM-141GBx8_TRT", "99"),
            "h200", 1, 896, 101.25, 100.35, 29228.22, (180.76, 124.29), (198.27, 123.26), (452.74, 146.04)),
    _mlperf("MLPerf v5.0 Server, TRT-LLM, 8 x H100 (TP2 x 4 assumed)", V50.format("DGX-H100_H100-SXM-80GBx8_TRT", "99.9"),
            "h100", 2, 1024, 107.19, 106.21, 31106.28, (443.16, 140.02), (517.08, 139.31), (1450.72, 141.40),
            note="v5.0 configuration not in the copy: v4.1's TP2 x 4 and batch 1,024 assumed", assumed=True),
]


class _LatencyRecorder(Recorder):
    """The run's Recorder plus each finished request's arrival beside its TTFT and TPOT, so a steady
    window and a mean can be read (engine/sim/results.py keeps only the percentiles' arrays)."""

    def __init__(self, arrivals: dict[str, float]) -> None:
        super().__init__(arrivals)
        self.rows: list[tuple[float, float, float]] = []  # (arrival, ttft, tpot or nan)

    def finish(self, seq: Any, earlier_tokens: tuple[float, ...] = ()) -> None:
        n_ttft, n_tpot = len(self.ttft), len(self.tpot)
        super().finish(seq, earlier_tokens)
        if len(self.ttft) > n_ttft:
            tpot = self.tpot[-1] if len(self.tpot) > n_tpot else float("nan")
            self.rows.append((self.arrivals[seq.request_id], self.ttft[-1], tpot))


class _Spec(SimSpec):
    """SimSpec with the engine's chunked-prefill switch (vLLM 0.6 ran without it), and the
    --host-us-per-seq sensitivity: host time per sampled row added to the device's (0 on GPUs)."""

    chunked_prefill: bool = True
    host_s_per_seq: float = 0.0

    def engine_config(self) -> EngineConfig:
        return super().engine_config().replace(chunked_prefill=self.chunked_prefill)

    def deployment(self) -> Deployment:
        dep = super().deployment()
        if not self.host_s_per_seq:
            return dep
        device = dataclasses.replace(dep.device, token_overhead_s=dep.device.token_overhead_s + self.host_s_per_seq)
        return dataclasses.replace(dep, device=device)


@dataclass
class Outcome:
    stats: dict[str, tuple[float, float]] = field(default_factory=dict)
    itl_p50_s: float = float("nan")  # the median gap between a request's token deliveries
    counted: int = 0
    result: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0


def run_row(row: Row, seconds: float, seed: int, host_s_per_seq: float = 0.0) -> Outcome:
    n = row.num_requests or round(row.rate * seconds)
    spec = _Spec(
        row.model, row.device, gpus=row.gpus, tp=row.tp, dtype=row.dtype, kv_dtype=row.kv_dtype or row.dtype,
        input_tokens=row.input_tokens, output_tokens=row.output_tokens, input_range_ratio=SPREAD, num_requests=n,
        rate=row.rate, max_num_seqs=row.max_num_seqs, max_batched_tokens=row.max_batched_tokens,
        admission=row.admission, seed=seed, prefill_first=row.prefill_first, scheduler_steps=row.scheduler_steps,
        central_queue=row.central_queue, host_profile=row.host_profile, kv_watermark=row.kv_watermark,
    )
    spec.chunked_prefill = row.chunked_prefill
    spec.host_s_per_seq = host_s_per_seq
    made: list[_LatencyRecorder] = []

    def recorder(arrivals: dict[str, float]) -> _LatencyRecorder:
        made.append(_LatencyRecorder(arrivals))
        return made[-1]

    start = time.perf_counter()
    sim_run.Recorder = recorder  # type: ignore[assignment]  # simulate() builds its Recorder by this name
    try:
        result = simulate(spec)
    finally:
        sim_run.Recorder = Recorder  # type: ignore[misc]
    wall = time.perf_counter() - start
    rows = np.array(made[0].rows, dtype=np.float64).reshape(-1, 3)
    if row.steady:
        end = n / row.rate  # the arrivals are rescaled to end at n / rate (engine/serving/load/loadgen.py)
        rows = rows[(rows[:, 0] >= WARMUP_S) & (rows[:, 0] <= end - TAIL_S)]
    ttft, tpot = rows[:, 1], rows[:, 2][~np.isnan(rows[:, 2])]
    stats = {
        "p50": (float(np.median(ttft)), float(np.median(tpot))),
        "mean": (float(np.mean(ttft)), float(np.mean(tpot))),
        "p99": (float(np.percentile(ttft, 99)), float(np.percentile(tpot, 99))),
    }
    # A ten-step run's tokens land together, as vLLM streamed them, so its gaps are the runs' (the
    # zero gaps inside a burst are one delivery, as the client's chunk is).
    gaps = np.frombuffer(made[0].itl, dtype=np.float64)
    gaps = gaps[gaps > 0] if row.scheduler_steps > 1 else gaps
    return Outcome(stats, float(np.median(gaps)) if gaps.size else float("nan"), len(rows), result, wall)


def err(sim: float, pub: float) -> float:
    return sim / pub - 1


def group(row: Row) -> str:
    return row.name.split(",")[0].split(" Server")[0].replace(" v4.1", "").replace(" v5.0", "")


def mapes(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """MAPE of the medians (the one statistic every row publishes), TTFT and TPOT apart, over every
    row and over subsets: rows whose configuration is all read from the source, and each engine."""
    subsets = {
        "all rows": records,
        "rows with a known configuration": [r for r in records if not r["assumed"]],
        **{f"{g} rows": [r for r in records if r["group"] == g and not r["assumed"]]
           for g in dict.fromkeys(r["group"] for r in records)},
    }
    out = {}
    for name, rows in subsets.items():
        if rows:
            out[name] = {m: 100 * float(np.mean([abs(r["stats"]["p50"][f"{m}_error"]) for r in rows])) for m in ("ttft", "tpot")}
            out[name]["rows"] = len(rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="*", default=list(range(len(ROWS))), help="row indices (default: all)")
    ap.add_argument("--seconds", type=float, default=300.0, help="MLPerf rows: simulated seconds of arrivals")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--host-us-per-seq", type=float, default=0.0,
                    help="a sensitivity, not a row's setting: host time per sampled row per step for the Python "
                         "engines of 2024 (the README rows; TensorRT-LLM's MLPerf rows keep none), written to "
                         "sim_latency_host.json, leaving the record the Plan page reads")
    args = ap.parse_args()
    if args.seconds <= WARMUP_S + TAIL_S:
        ap.error(f"--seconds must exceed {WARMUP_S + TAIL_S:.0f} (the warm-up and the tail)")
    began = time.perf_counter()
    out_rows = []
    lines = [
        "| # | row | source | rate (req/s) | stat | TTFT published | TTFT sim | error | TPOT published | TPOT sim | error |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    # The step alone: median ITL leaves out most prefill stalls, which land on few of the gaps.
    itl_lines = ["| # | row | median ITL published | sim | error |", "|---|---|---:|---:|---:|"]
    for i in args.rows:
        row = ROWS[i]
        o = run_row(row, args.seconds, args.seed, args.host_us_per_seq / 1e6 if row.source == README else 0.0)
        record: dict[str, Any] = {
            "row": row.name, "source": row.source, "model": row.model, "device": row.device, "gpus": row.gpus,
            "tp": row.tp, "dtype": row.dtype, "rate": row.rate, "input_tokens": row.input_tokens,
            "output_tokens": row.output_tokens, "input_range_ratio": SPREAD, "requests": o.result["completed"],
            "counted": o.counted, "max_num_seqs": row.max_num_seqs, "max_batched_tokens": row.max_batched_tokens,
            "chunked_prefill": row.chunked_prefill, "admission": row.admission, "kv_watermark": row.kv_watermark,
            "prefill_first": row.prefill_first,
            "scheduler_steps": row.scheduler_steps, "central_queue": row.central_queue, "note": row.note,
            "host_profile": row.host_profile, "host_profile_source": PROFILES[row.host_profile].source,
            "group": group(row), "assumed": row.assumed,
            "running_max": o.result["running_max"], "preemptions": o.result["preemptions"],
            "kv_usage_max": o.result["kv_usage_max"], "output_tok_s": o.result["output_tok_s"], "wall_s": o.wall_s,
            "stats": {},
        }
        for stat, (pub_ttft, pub_tpot) in row.published.items():
            sim_ttft, sim_tpot = o.stats[stat]
            e_ttft, e_tpot = err(sim_ttft, pub_ttft), err(sim_tpot, pub_tpot)
            record["stats"][stat] = {"ttft_published_s": pub_ttft, "ttft_sim_s": sim_ttft, "ttft_error": e_ttft,
                                     "tpot_published_s": pub_tpot, "tpot_sim_s": sim_tpot, "tpot_error": e_tpot}
            src = row.source.split(" ")[0]
            lines.append(
                f"| {i} | {row.name} | {src} | {row.rate:g} | {stat} | {1e3 * pub_ttft:.1f} ms | {1e3 * sim_ttft:.1f} ms"
                f" | {100 * e_ttft:+.1f}% | {1e3 * pub_tpot:.2f} ms | {1e3 * sim_tpot:.2f} ms | {100 * e_tpot:+.1f}% |"
            )
        if row.itl_published_s is not None:
            e_itl = err(o.itl_p50_s, row.itl_published_s)
            record["itl_p50"] = {"published_s": row.itl_published_s, "sim_s": o.itl_p50_s, "error": e_itl}
            itl_lines.append(f"| {i} | {row.name} | {1e3 * row.itl_published_s:.2f} ms | {1e3 * o.itl_p50_s:.2f} ms"
                             f" | {100 * e_itl:+.1f}% |")
        out_rows.append(record)
        print(f"[{i}] {row.name}: {o.result['completed']} requests ({o.counted} counted), running max "
              f"{o.result['running_max']}, wall {o.wall_s:.1f} s; host profile {row.host_profile} "
              f"({PROFILES[row.host_profile].source})", flush=True)
    mape = mapes(out_rows)
    itl_errors = [abs(r["itl_p50"]["error"]) for r in out_rows if "itl_p50" in r]
    itl_mape = {"rows": len(itl_errors), "itl": 100 * float(np.mean(itl_errors))} if itl_errors else None
    print()
    print("\n".join(lines))
    print()
    if itl_mape:
        print("\n".join(itl_lines))
        print(f"median ITL MAPE over {itl_mape['rows']} rows: {itl_mape['itl']:.1f}%")
        print()
    print("| MAPE of the medians | rows | TTFT (goal <= 25%) | TPOT (goal <= 15%) |")
    print("|---|---:|---:|---:|")
    for name, m in mape.items():
        print(f"| {name} | {m['rows']:.0f} | {m['ttft']:.1f}% | {m['tpot']:.1f}% |")
    total = time.perf_counter() - began
    print(f"wall time {total:.0f} s")
    path = ROOT / "bench" / "results" / ("sim_latency_host.json" if args.host_us_per_seq else "sim_latency.json")
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({
        "date": datetime.date.today().isoformat(),
        "command": "python -m bench.sim_latency" + (f" --host-us-per-seq {args.host_us_per_seq:g}" if args.host_us_per_seq else ""),
        "host_us_per_seq": args.host_us_per_seq,
        "spread": SPREAD, "steady_window_s": [WARMUP_S, args.seconds - TAIL_S], "seconds": args.seconds,
        "seed": args.seed, "mape_p50_percent": mape,
        "itl_mape_p50_percent": itl_mape, "wall_s": total, "rows": out_rows,
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
