"""What a simulated run measured, from each finished request's RequestTimes: the keys of the
CLI contract (DESIGN.md), `vllm bench serve`'s definitions (ttft, tpot, itl, e2el, goodput)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.core.sequence import FinishReason, Sequence
from engine.serving.replicas.messages import RequestError
from engine.sim.loop import EventLoop
from engine.sim.pipelined_replica import PipelinedSimReplica
from engine.sim.replica import SimReplica


@dataclass
class Recorder:
    """Per finished request: ttft, tpot, e2el and every inter-token gap, as plain float arrays."""

    arrivals: dict[str, float]
    ttft: array = field(default_factory=lambda: array("d"))
    first_at: array = field(default_factory=lambda: array("d"))  # each ttft's first-token time (a timeline's window)
    tpot: array = field(default_factory=lambda: array("d"))
    e2el: array = field(default_factory=lambda: array("d"))
    # Every finished request's token times end to end, and where each request's begin: the gaps
    # are taken once, at the end (a gap array a request cost a numpy round trip each).
    token_times: array = field(default_factory=lambda: array("d"))
    token_starts: array = field(default_factory=lambda: array("q"))
    good: int = 0
    output_tokens: int = 0
    finished: dict[str, str] = field(default_factory=dict)  # request id -> finish reason
    slo_s: tuple[float, float] = (float("inf"), float("inf"))  # (ttft, tpot)

    def finish(self, seq: Sequence, earlier_tokens: tuple[float, ...] = ()) -> None:
        """earlier_tokens: token times produced elsewhere first (a disaggregated prefill's token)."""
        self.finished[seq.request_id] = seq.finish_reason or ""
        t = seq.times
        if seq.finish_reason == FinishReason.ABORT or t.first_token is None or t.finished is None:
            return
        arrival = self.arrivals[seq.request_id]
        tokens = [*earlier_tokens, *t.tokens] if earlier_tokens else t.tokens
        ttft = tokens[0] - arrival
        tpot = (tokens[-1] - tokens[0]) / (len(tokens) - 1) if len(tokens) > 1 else 0.0
        self.ttft.append(ttft)
        self.first_at.append(tokens[0])
        self.e2el.append(t.finished - arrival)
        if len(tokens) > 1:
            self.tpot.append(tpot)
        self.token_starts.append(len(self.token_times))
        self.token_times.fromlist(tokens)  # twice as fast as extend(): sized once
        self.output_tokens += len(tokens)
        self.good += ttft <= self.slo_s[0] and tpot <= self.slo_s[1]

    @property
    def itl(self) -> np.ndarray:
        """Every gap between deliveries, request by request (none across two requests): float64,
        made when asked (a ten-minute fleet's 45 million, so no copy beyond the one). Tokens that
        land together (a speculating step's, a multi-step run's) are one delivery, as `vllm bench
        serve` counts a chunk."""
        times = np.frombuffer(self.token_times, dtype=np.float64)
        if len(times) < 2:
            return np.empty(0)
        across = np.frombuffer(self.token_starts, dtype=np.int64)[1:] - 1  # a request's last -> the next's first
        gaps = np.delete(np.diff(times), across)
        return gaps if gaps.min(initial=1.0) > 0 else gaps[gaps > 0]


def _pct(values: array | np.ndarray, p: float) -> float:
    return float(np.percentile(np.frombuffer(values, dtype=np.float64), p)) if len(values) else 0.0


def _itl_pct(rec: Recorder, p: float) -> float:
    """The gaps are made for this alone: the percentile partitions them in place, no copy."""
    gaps = rec.itl
    return float(np.percentile(gaps, p, overwrite_input=True)) if len(gaps) else 0.0


def summarize(rec: Recorder, duration_s: float, num_gpus: int) -> dict[str, float]:
    done = len(rec.ttft)
    d = max(duration_s, 1e-9)
    return {
        "output_tok_s": rec.output_tokens / d,
        "output_tok_s_per_gpu": rec.output_tokens / d / num_gpus,
        "request_s": done / d,
        "ttft_p50_s": _pct(rec.ttft, 50),
        "ttft_p99_s": _pct(rec.ttft, 99),
        "tpot_p50_s": _pct(rec.tpot, 50),
        "tpot_p99_s": _pct(rec.tpot, 99),
        "itl_p99_s": _itl_pct(rec, 99),
        "e2el_p50_s": _pct(rec.e2el, 50),
        "goodput_req_s": rec.good / d,
        "completed": done,
    }


def replica_figures(
    replicas: list[SimReplica], refused: dict[str, str], loop: EventLoop, ran_s: float, wall_s: float,
    front: list[SimReplica] | None = None,
) -> dict[str, Any]:
    """What every run reports of its replicas and its refusals, besides the request figures. front:
    the replicas the clients' prompts reach (a P/D split's prefill pool: a decode replica finds
    the KV it is handed as cached, which is no prefix-cache hit); None, all of them."""
    reasons: dict[str, int] = {}
    for reason in refused.values():
        reasons[reason] = reasons.get(reason, 0) + 1
    stages = [r.stage_idle_share(ran_s) for r in replicas if isinstance(r, PipelinedSimReplica)]
    # Pipeline stages: each stage's idle share of the run, averaged over the replicas (the bubble).
    extra = {"stage_idle_share": [sum(column) / len(column) for column in zip(*stages)]} if stages else {}
    checks = sum(r.engine.speculation.checks for r in replicas)
    if checks:  # speculative decoding: the share of guesses kept, and tokens per verify step (as live)
        drafts, kept = (sum(getattr(r.engine.speculation, k) for r in replicas) for k in ("proposed", "accepted"))
        extra |= {"spec_acceptance": kept / drafts if drafts else 0.0, "spec_tokens_per_step": 1 + kept / checks}
    front = replicas if front is None else front
    queries = sum(r.engine.kv.prefix_queries for r in front)
    return extra | {
        # Prompt tokens found in the prefix cache at admission, of all looked up (the live snapshot's
        # prefix_hit_rate, over the whole run); 0 with the cache off.
        "prefix_hit_rate": sum(r.engine.kv.prefix_hits for r in front) / queries if queries else 0.0,
        "kv_usage_max": max(r.kv_usage_max for r in replicas),
        "running_max": max(r.running_max for r in replicas),
        "preemptions": sum(r.engine.scheduler.num_preemptions for r in replicas),
        "wall_s": wall_s,
        "sim_s_per_wall_s": ran_s / wall_s,
        "refused": reasons,
        "kv_blocks_per_replica": replicas[0].engine.kv.num_blocks,
        "kv_blocks_free_at_end": all(r.engine.kv.num_used_blocks == 0 for r in replicas),
        "steps": sum(r.engine.num_steps for r in replicas),
        "events": loop.num_events,
    }


def take_errors(streams: dict[str, Any], finished: dict[str, str], refused: dict[str, str]) -> None:
    """Requests that did not finish were answered with a RequestError (deadline, failed replica)."""
    for request_id, events in streams.items():
        if request_id in finished:
            continue
        while not events.empty():
            event = events.get_nowait()
            if isinstance(event, RequestError):
                refused[request_id] = event.message
                break
