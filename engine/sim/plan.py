"""`python -m engine.sim plan`: the cheapest deployment that meets the SLOs, and the frontier of
output tokens/s per GPU against tokens/s per user, from simulated runs of the real serving code.

The shapes come from engine/sim/plan_space.py, one line per device x precision x TP x PP,
aggregated or split into prefill and decode pools. A line is walked up its replica counts, fewest first (the bound's least
that could keep up): each count is simulated with its batch slots from the fewest up (more slots
than a run ever filled change nothing but a little KV), and the walk stops one count after the
first that meets both SLOs, or once another replica stops helping. Lines run in parallel
processes; every run has the query's seed, so the same query gives the same plan. A search run
is short (its p99 from a few hundred requests), so the cheapest feasible shape is re-run
CONFIRM_LONGER times as long before it is chosen, and the next cheapest tried if it misses.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from engine.clock import stopwatch
from engine.sim.launch_commands import launch_commands, sim_command
from engine.sim.plan_space import PlanQuery, Shape, Space, search_space
from engine.sim.run import simulate

# A walk up a line's replica counts goes this many counts past its first feasible one (the
# frontier continues there, more GPUs buying speed per user) ...
PAST_FEASIBLE = 1
# ... and stops when a replica more improves neither p99 by this much (the floor is the shape's).
STILL_HELPS = 0.03
# Slots a run never filled, with KV below this, would not change it.
SLOTS_UNTOUCHED_KV = 0.9
CONFIRM_TRIES = 5  # cheapest feasible shapes re-run at most, before the plan says none held


@dataclass(frozen=True)
class PlanPoint:
    """One simulated shape and what it did with the query's traffic."""

    shape: Shape
    figures: dict[str, float]  # the simulator's contract keys (engine/sim/__main__.py)
    usd_per_hour: float
    meets_slo: bool
    keeps_up: bool  # the fleet finished the traffic about as fast as it came (no growing queue)

    @property
    def output_tok_s_per_gpu(self) -> float:
        return self.figures["output_tok_s_per_gpu"]

    @property
    def tok_s_per_user(self) -> float:
        """1 / median TPOT: how fast one user reads, as the frontier plots it."""
        tpot = self.figures["tpot_p50_s"]
        return 1 / tpot if tpot > 0 else 0.0

    @property
    def usd_per_m_tokens(self) -> float:
        tok_s = self.figures["output_tok_s"]
        return self.usd_per_hour / 3600 / tok_s * 1e6 if tok_s > 0 else float("inf")

    def slo_ratio(self, q: PlanQuery) -> float:
        """How far the worse p99 is from its target (<= 1 meets both)."""
        return max(self.figures["ttft_p99_s"] * 1000 / q.ttft_slo_ms, self.figures["tpot_p99_s"] * 1000 / q.tpot_slo_ms)

    def to_json(self, q: PlanQuery) -> dict[str, Any]:
        f = self.figures
        return self.shape.to_json() | {
            "output_tok_s_per_gpu": self.output_tok_s_per_gpu, "tok_s_per_user": self.tok_s_per_user,
            "ttft_p50_s": f["ttft_p50_s"], "ttft_p99_s": f["ttft_p99_s"], "tpot_p50_s": f["tpot_p50_s"],
            "tpot_p99_s": f["tpot_p99_s"], "goodput_req_s": f["goodput_req_s"], "output_tok_s": f["output_tok_s"],
            "request_s": f["request_s"],
            "usd_per_hour": self.usd_per_hour, "usd_per_m_tokens": self.usd_per_m_tokens,
            "meets_slo": self.meets_slo, "keeps_up": self.keeps_up, "command": sim_command(self.shape.spec(q)),
            "lab": "/lab?" + urlencode(lab_levers(self.shape, q, f["request_s"])),
        }  # fmt: skip


def lab_levers(shape: Shape, q: PlanQuery, request_s: float | None = None) -> dict[str, Any]:
    """The simulated lab's levers for a shape (engine/levers.py keys, as a shared lab link sets them).
    The lab's clients send at a rate: a closed loop's is the rate its run achieved (request_s)."""
    group = shape.tp * shape.pp
    rate = q.rate if q.rate is not None else round(request_s or 0.0, 3)
    levers: dict[str, Any] = {
        "executor": "sim", "model": q.model, "device": shape.device, "gpu_count": shape.gpus,
        "tensor_parallel": shape.tp, "pipeline_parallel": shape.pp, "weight_dtype": shape.dtype,
        "kv_dtype": shape.kv_dtype, "prompt_tokens": q.input_tokens, "output_tokens": q.output_tokens,
        "request_rate": rate, "max_num_seqs": shape.max_num_seqs, "ttft_target_ms": round(q.ttft_slo_ms),
        "gpu_hour_usd": q.price(shape.device),
    }  # fmt: skip
    if shape.prefill_replicas:
        levers["prefill_gpus"] = shape.prefill_replicas * group
        levers["decode_gpus"] = (shape.replicas - shape.prefill_replicas) * group
    return levers


@dataclass
class Plan:
    query: PlanQuery
    space: Space
    points: list[PlanPoint] = field(default_factory=list)
    confirmed: PlanPoint | None = None  # the chosen shape's longer re-run (query.confirming())
    rejected: list[PlanPoint] = field(default_factory=list)  # cheaper shapes whose re-run missed
    wall_s: float = 0.0

    @property
    def frontier(self) -> list[PlanPoint]:
        return pareto([p for p in self.points if p.keeps_up])

    @property
    def cheapest(self) -> PlanPoint | None:
        """The cheapest shape of the search whose longer re-run also met both SLOs."""
        if self.confirmed is None:
            return None
        return next(p for p in self.points if p.shape == self.confirmed.shape)

    def confirm(self) -> None:
        """Re-run the cheapest feasible shapes, cheapest first, until one meets both SLOs again."""
        longer = self.query.confirming()
        for point in sorted((p for p in self.points if p.meets_slo), key=_cost_key)[:CONFIRM_TRIES]:
            again = evaluate(point.shape, longer)
            if again.meets_slo:
                self.confirmed = again
                return
            self.rejected.append(again)

    @property
    def closest(self) -> PlanPoint | None:
        """Without a confirmed point, the one nearest both targets (then the cheaper)."""
        q = self.query
        return min(self.points, key=lambda p: (p.slo_ratio(q), _cost_key(p))) if self.points else None

    def to_json(self) -> dict[str, Any]:
        q, ids = self.query, {id(p): i for i, p in enumerate(self.points)}
        cheapest, closest = self.cheapest, self.closest
        points = [p.to_json(q) | {"id": i} for i, p in enumerate(self.points)]
        if cheapest is not None:
            verdict = f"cheapest that meets both SLOs: {_describe(cheapest)}"
            if self.rejected:
                verdict += f" ({len(self.rejected)} cheaper shape(s) met them in the search but not in a longer re-run)"
        elif closest is not None:
            verdict = (
                f"no shape searched meets TTFT p99 <= {q.ttft_slo_ms:g} ms and TPOT p99 <= {q.tpot_slo_ms:g} ms; "
                f"closest: {_describe(closest)} (TTFT p99 {closest.figures['ttft_p99_s'] * 1000:.0f} ms, "
                f"TPOT p99 {closest.figures['tpot_p99_s'] * 1000:.1f} ms)"
            )
        else:
            verdict = "no shape of the search can run this model: " + _unfit_reason(self.space)
        return {
            "query": _query_json(q),
            "search": {
                "enumerated": self.space.enumerated, "unfit": self.space.unfit, "too_slow_by_bound": self.space.too_slow,
                "idle": self.space.idle, "lines": len(_lines(self.space.shapes)), "evaluated": len(self.points),
                "wall_s": self.wall_s,
            },
            "points": points,
            "frontier": [points[ids[id(p)]] for p in self.frontier],
            "feasible": cheapest is not None,
            # The chosen shape's own longer re-run: its figures, the command that reproduces them.
            "cheapest": None if self.confirmed is None or cheapest is None else _chosen(
                self.confirmed.to_json(q.confirming()) | {"id": ids[id(cheapest)], "requests": q.confirming().num_requests},
                cheapest.shape, q,
            ),
            "closest": None if cheapest is not None or closest is None
            else _chosen(points[ids[id(closest)]], closest.shape, q) | {"reason": verdict},
            "rejected_on_rerun": [p.to_json(q.confirming()) for p in self.rejected],
            "verdict": verdict,
        }  # fmt: skip


def _chosen(point: dict[str, Any], shape: Shape, q: PlanQuery) -> dict[str, Any]:
    """A chosen point with the command lines that deploy it (`launch`: every server of it;
    `vllm_command` / `sglang_command`: the first, the whole deployment where it is one kind)."""
    launch = launch_commands(shape, q)
    first = {server: launch[server][0]["command"] if server in launch else None for server in ("vllm", "sglang", "servelab")}
    out = point | {"launch": launch, "vllm_command": first["vllm"], "sglang_command": first["sglang"]}
    return out | ({"servelab_command": first["servelab"]} if first["servelab"] else {})


def _cost_key(p: PlanPoint) -> tuple[float, float, int]:
    return (p.usd_per_hour, -p.tok_s_per_user, p.shape.gpus)


def _describe(p: PlanPoint) -> str:
    s = p.shape
    split = f", {s.prefill_replicas} prefill + {s.replicas - s.prefill_replicas} decode" if s.prefill_replicas else ""
    stages = f" x PP{s.pp}" if s.pp > 1 else ""
    return (
        f"{s.replicas} x TP{s.tp}{stages} on {s.gpus} {s.device} in {s.dtype}{split}, {s.max_num_seqs} slots, "
        f"${p.usd_per_hour:.2f}/h, ${p.usd_per_m_tokens:.3f} per M output tokens"
    )


def _unfit_reason(space: Space) -> str:
    return f"all {space.enumerated} shapes either do not fit or cannot keep up with the traffic even by the bound"


def _query_json(q: PlanQuery) -> dict[str, Any]:
    return {
        "model": q.model, "rate": q.rate, "concurrency": q.concurrency, "input_tokens": q.input_tokens,
        "output_tokens": q.output_tokens,
        "input_range_ratio": q.input_range_ratio, "ttft_slo_ms": q.ttft_slo_ms, "tpot_slo_ms": q.tpot_slo_ms,
        "devices": list(q.devices), "max_gpus": q.max_gpus, "gpu_hour_usd": {d: q.price(d) for d in q.devices},
        "num_requests": q.num_requests, "seed": q.seed,
    }  # fmt: skip


def pareto(points: list[PlanPoint]) -> list[PlanPoint]:
    """The points no other beats on both tokens/s per GPU and tokens/s per user, by per GPU."""
    ranked = sorted(points, key=lambda p: (-p.output_tok_s_per_gpu, -p.tok_s_per_user))
    front: list[PlanPoint] = []
    best_user = float("-inf")
    for p in ranked:
        if p.tok_s_per_user > best_user:
            front.append(p)
            best_user = p.tok_s_per_user
    return front


def evaluate(shape: Shape, q: PlanQuery) -> PlanPoint:
    spec = shape.spec(q)
    requests = spec.workload()  # the same for every shape of the query (its seed)
    figures = simulate(spec, requests)
    ttft_ok = figures["ttft_p99_s"] * 1000 <= q.ttft_slo_ms
    tpot_ok = figures["tpot_p99_s"] * 1000 <= q.tpot_slo_ms
    done = figures["completed"] == q.num_requests
    if q.concurrency is not None:
        keeps_up = done  # a closed loop's clients wait for their answers: its backlog is at most them
    else:
        # A fleet that keeps up ends about one request's time after the last arrival; one behind
        # ends with a backlog, its last request waiting longest.
        figures["last_arrival_s"] = max(r.arrival for r in requests)
        keeps_up = done and figures["simulated_s"] - figures["last_arrival_s"] <= 1.5 * figures["e2el_p50_s"] + 1.0
    usd = shape.gpus * q.price(shape.device)
    return PlanPoint(shape, figures, usd, ttft_ok and tpot_ok and done, keeps_up)


def _lines(shapes: list[Shape]) -> dict[tuple[Any, ...], list[Shape]]:
    lines: dict[tuple[Any, ...], list[Shape]] = {}
    for s in shapes:
        lines.setdefault((s.device, s.dtype, s.tp, s.pp, bool(s.prefill_replicas)), []).append(s)
    return lines


def walk_line(shapes: list[Shape], q: PlanQuery) -> list[PlanPoint]:
    """A line's points: its replica counts fewest first, each count's slots fewest first."""
    by_count: dict[int, list[Shape]] = {}
    for s in shapes:
        by_count.setdefault(s.replicas, []).append(s)
    points: list[PlanPoint] = []
    past, last = -1, None
    for count in sorted(by_count):
        best = None
        for shape in sorted(by_count[count], key=lambda s: s.max_num_seqs):
            point = evaluate(shape, q)
            points.append(point)
            best = point if best is None or point.slo_ratio(q) < best.slo_ratio(q) else best
            f = point.figures
            if f["running_max"] < shape.max_num_seqs and f["kv_usage_max"] < SLOTS_UNTOUCHED_KV:
                break  # more slots than this run ever filled would not change it
        assert best is not None
        if past >= 0 or best.meets_slo:
            past += 1
            if past >= PAST_FEASIBLE:
                break
        elif last is not None and _stalled(last, best):
            break
        last = best
    return points


def _stalled(before: PlanPoint, after: PlanPoint) -> bool:
    """Another replica no longer helps: neither p99 fell by STILL_HELPS."""
    keys = ("ttft_p99_s", "tpot_p99_s")
    return all(after.figures[k] > (1 - STILL_HELPS) * before.figures[k] for k in keys)


def _walk(args: tuple[list[Shape], PlanQuery]) -> list[PlanPoint]:
    return walk_line(*args)


def run_plan(
    q: PlanQuery, workers: int | None = None, progress: Callable[[int, int], None] | None = None
) -> Plan:
    """The whole search; progress(lines done, lines) after each line."""
    q.check()
    elapsed = stopwatch()
    space = search_space(q)
    # The lines with the most shapes first: the pool's last worker is not left with a long one.
    lines = sorted(_lines(space.shapes).values(), key=len, reverse=True)
    plan = Plan(q, space)
    workers = max(1, min(workers or os.cpu_count() or 1, len(lines) or 1))
    for done, points in enumerate(_map(_walk, [(line, q) for line in lines], workers), 1):
        plan.points.extend(points)
        if progress is not None:
            progress(done, len(lines))
    plan.confirm()
    plan.wall_s = elapsed()
    return plan


def _map(fn: Callable[[Any], list[PlanPoint]], items: list[Any], workers: int) -> Iterator[list[PlanPoint]]:
    """In order, whatever order the workers finish in: the plan is the same for any worker count."""
    if workers == 1:
        yield from map(fn, items)
        return
    with ProcessPoolExecutor(workers) as pool:
        yield from pool.map(fn, items, chunksize=1)


def plan_for_page(q: PlanQuery, progress_path: str | None = None) -> dict[str, Any]:
    """The what-if worker's plan run for the Plan page: one process (the worker's, at the lowest
    priority), its progress written to progress_path for the page to poll."""

    def progress(done: int, total: int) -> None:
        if progress_path is not None:
            Path(progress_path).write_text(json.dumps({"done": done, "total": total}))

    return run_plan(q, workers=1, progress=progress).to_json()
