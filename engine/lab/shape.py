"""The recommended shape: which stage of the System Design Lab's architecture path the current
levers call for, and why, from the same numbers the envelope and bottleneck panels show.

The path: one GPU serving one request -> a KV cache with (static) batching -> continuous
batching + paged attention -> tensor-parallel sharding -> prefill/decode disaggregation. A
later stage keeps the earlier ones. Pure functions over typed inputs, so they are unit-tested
without an engine and serve both executors (live: a replica's measured facts; simulated: the
deployment's). The concurrency thresholds are teaching assumptions, said as such on the page."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from engine.lab.envelope import Bottleneck, Facts, decode_step_ms
from engine.serving.telemetry.snapshot import FleetSnapshot

ONE_REQUEST_MAX = 1.0  # requests in flight (Little's law) up to which one-at-a-time keeps up
STATIC_BATCH_MAX = 4.0  # up to this many in flight a static batch wastes little (teaching assumption)
LONG_PROMPT_TOKENS = 1024  # prompts this long make prefill, not the queue, the TTFT cost
DECODE_HEADROOM = 0.5  # decode below this share of its roofline has room to spare


class Stage(enum.IntEnum):
    ONE_REQUEST = 1
    BATCHING = 2
    CONTINUOUS_PAGED = 3
    TENSOR_PARALLEL = 4
    DISAGGREGATED = 5


STAGE_TITLES = {
    Stage.ONE_REQUEST: "One GPU serving one request",
    Stage.BATCHING: "KV cache with batching",
    Stage.CONTINUOUS_PAGED: "Continuous batching + paged attention",
    Stage.TENSOR_PARALLEL: "Tensor-parallel sharding",
    Stage.DISAGGREGATED: "Prefill/decode disaggregation",
}


@dataclass(frozen=True)
class ShapeInputs:
    """What the recommendation reads: the workload levers, the deployment, and measurements."""

    request_rate: float
    prompt_tokens: int
    output_tokens: int
    ttft_target_s: float
    tensor_parallel: int
    device: str  # e.g. "H100", "CPU core"
    device_memory_bytes: int  # per device, as its datasheet labels it (shown, not compared: min_tensor_parallel is the fit)
    weight_bytes_total: int  # every weight once, all devices together
    min_tensor_parallel: int | None  # the smallest TP degree that fits the weights; None: none does
    decode_step_s: float | None  # one sequence's decode step (roofline); None: not known yet
    disaggregated: bool = False  # the levers already split prefill from decode
    prefill_gpus: int = 0
    decode_gpus: int = 0
    ttft_p99_s: float | None = None  # measured
    decode_ratio: float | None = None  # measured tokens/s over the decode roofline


@dataclass
class Shape:
    stage: Stage
    reasons: list[str] = field(default_factory=list)

    def view(self) -> dict[str, Any]:
        return {
            "stage": int(self.stage),
            "title": STAGE_TITLES[self.stage],
            "reasons": self.reasons,
            "path": [
                {"stage": int(s), "title": t, "state": "done" if s < self.stage else "current" if s == self.stage else "later"}
                for s, t in STAGE_TITLES.items()
            ],
        }


def _gb(n: float) -> str:
    if n < 1e9:
        return f"{n / 1e6:.0f} MB"
    text = f"{n / 1e9:.0f}" if n >= 100e9 else f"{n / 1e9:.1f}".removesuffix(".0")
    return f"{text} GB"


def recommend(x: ShapeInputs) -> Shape:
    """The stage the levers call for, with the reasons that put it there."""
    reasons: list[str] = []
    stage = Stage.ONE_REQUEST
    if x.decode_step_s is not None:
        in_flight = x.request_rate * x.output_tokens * x.decode_step_s  # Little's law, decode-bound
        if in_flight <= ONE_REQUEST_MAX:
            reasons.append(f"about {in_flight:.1f} requests in flight: one GPU serving one request at a time keeps up")
        elif in_flight <= STATIC_BATCH_MAX:
            stage = Stage.BATCHING
            reasons.append(f"about {in_flight:.1f} requests in flight: batch them over a KV cache to share each weight read")
        else:
            stage = Stage.CONTINUOUS_PAGED
            reasons.append(
                f"about {in_flight:.0f} requests in flight of lengths that vary: continuous batching + paged KV "
                "keeps every slot busy and holds only real tokens"
            )
    per_device = x.weight_bytes_total / x.tensor_parallel
    if x.min_tensor_parallel is None or x.min_tensor_parallel > 1:
        stage = max(stage, Stage.TENSOR_PARALLEL)
        if x.min_tensor_parallel is None:
            reasons.append(
                f"weights {_gb(x.weight_bytes_total)} fit no TP group of {x.device}s up to 8: use fp8 or two nodes"
            )
        elif x.tensor_parallel < x.min_tensor_parallel:
            reasons.append(
                f"weights {_gb(x.weight_bytes_total)} > {_gb(x.device_memory_bytes)} per {x.device}: "
                f"shard, TP >= {x.min_tensor_parallel}"
            )
        else:
            reasons.append(
                f"weights {_gb(x.weight_bytes_total)} > {_gb(x.device_memory_bytes)} per {x.device}: "
                f"shard, TP >= {x.min_tensor_parallel} (TP{x.tensor_parallel} here: {_gb(per_device)} per {x.device})"
            )
    over = x.ttft_p99_s is not None and x.ttft_p99_s > x.ttft_target_s
    if x.disaggregated:
        stage = Stage.DISAGGREGATED
        reasons.append(f"prefill pool of {x.prefill_gpus} GPUs, decode pool of {x.decode_gpus}: a long prompt never stalls a decode step")
    elif over and x.prompt_tokens >= LONG_PROMPT_TOKENS and (x.decode_ratio is None or x.decode_ratio < DECODE_HEADROOM):
        stage = Stage.DISAGGREGATED
        headroom = "" if x.decode_ratio is None else f" ({x.decode_ratio:.0%} of its roofline)"
        reasons.append(
            f"TTFT p99 {x.ttft_p99_s * 1000:.0f} ms over the {x.ttft_target_s * 1000:.0f} ms target while decode has "  # type: ignore[operator]
            f"headroom{headroom}: split prefill from decode"
        )
    elif over:
        reasons.append(
            f"TTFT p99 {x.ttft_p99_s * 1000:.0f} ms over the {x.ttft_target_s * 1000:.0f} ms target with short prompts: "  # type: ignore[operator]
            "the queue is the cost, add replicas"
        )
    return Shape(stage, reasons)


def min_tensor_parallel(fits: dict[int, bool]) -> int | None:
    """The smallest degree that fits, of those tried; None if none does."""
    return next((tp for tp in sorted(fits) if fits[tp]), None)


def decode_step_s(facts: Facts, prompt_tokens: int, output_tokens: int) -> float | None:
    """One sequence's decode step at its roofline (the envelope's), from a replica's facts."""
    if not facts.roofline_known:
        return None
    return decode_step_ms(facts, 1, prompt_tokens + output_tokens // 2) / 1000


def shape_for(
    levers: dict[str, Any], facts: Facts, snap: FleetSnapshot, readings: list[Bottleneck],
    device: str, device_memory_bytes: int, weight_bytes_total: int, min_tp: int | None, simulated: bool,
) -> Shape:
    """The recommendation for a lab's levers, a replica's facts, a snapshot and its bottleneck
    readings (the decode one says how much headroom decode has)."""
    decode = next((r.ratio for r in readings if r.key == "decode"), None)
    prompt, output = int(levers["prompt_tokens"]), int(levers["output_tokens"])
    return recommend(ShapeInputs(
        request_rate=float(levers["request_rate"]), prompt_tokens=prompt, output_tokens=output,
        ttft_target_s=int(levers["ttft_target_ms"]) / 1000, tensor_parallel=int(levers["tensor_parallel"]),
        device=device, device_memory_bytes=device_memory_bytes, weight_bytes_total=weight_bytes_total,
        min_tensor_parallel=min_tp, decode_step_s=decode_step_s(facts, prompt, output),
        disaggregated=simulated and int(levers["prefill_gpus"]) > 0,  # the live engine has one pool
        prefill_gpus=int(levers["prefill_gpus"]), decode_gpus=int(levers["decode_gpus"]),
        ttft_p99_s=snap.ttft_p99, decode_ratio=decode,
    ))


# The System Design Lab's decision trade-offs, with the stage each belongs to.
TRADEOFFS = (
    ("KV cache management", Stage.BATCHING,
     ("Keeping each sequence's keys and values saves recomputing the prompt every token, but the cache grows "
     "per token and, not the weights, decides how many requests fit.")),
    ("Continuous batching", Stage.CONTINUOUS_PAGED,
     ("Admitting and retiring requests every step keeps the GPU busy across lengths that differ; the price is a "
     "scheduler that runs every step and pages of KV instead of one slab per request.")),
    ("Tensor-parallel sharding", Stage.TENSOR_PARALLEL,
     ("Splitting each layer lets a model bigger than one GPU run and cuts the weight bytes each GPU reads a step, "
     "at two all-reduces a layer on every step.")),
    ("Prefill/decode split", Stage.DISAGGREGATED,
     ("Separate pools keep a long prompt's compute-bound prefill from stalling everyone's decode, and size each "
     "pool for its own bottleneck; the KV must then travel between them.")),
    ("GPU autoscaling", Stage.CONTINUOUS_PAGED,
     ("Replicas follow demand, read from queue depth, batch slots, KV use and p99 TTFT against its target, but "
     "a new one takes minutes to provision and load: scale out on a short window, in on a long one and only "
     "once TTFT is under half its target, keep a warm pool, and drain instead of cutting streams.")),
    ("Token streaming", Stage.ONE_REQUEST,
     ("Sending each token as it is made turns a long wait into a short time to first token; the connection "
     "stays open for the whole generation.")),
)
