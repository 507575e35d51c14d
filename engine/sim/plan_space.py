"""What a deployment plan searches: the question (model, traffic, SLOs, devices, prices) and the
shapes that might answer it (device x weight dtype x TP x PP x replicas x prefill/decode split x
batch slots; a split fleet's prefill pool is the size that balances the two pools' bounds). A cheap analytic bound from the cost model prunes shapes that cannot keep up with
the traffic, or that add replicas no request would wait for; it never ranks what it keeps: every
kept shape is simulated (engine/sim/plan.py)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

from engine.catalog import DEVICE_NAMES, MODEL_NAMES
from engine.errors import InvalidParamError
from engine.sim import constants as C
from engine.sim.cost_model import CostModel, StepShape
from engine.sim.deployment import WEIGHT_DTYPES, Deployment, SimConfigError
from engine.sim.spec import SimSpec

# Replica counts tried: dense where a replica more is a large step, sparse beyond.
REPLICA_GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 192, 256)
# The bound is an upper bound on a shape's throughput; this margin keeps a shape whose bound
# falls just short (chunked prefill mixed into decode steps, the pipeline's bubble) in the search.
BOUND_MARGIN = 1.5
MAX_GPUS = 512  # the lab's gpu_count lever's bound
# A search's p99 comes from few requests; the cheapest feasible shape is re-run this many times as
# long before it is chosen (and the next cheapest tried if it then misses).
CONFIRM_LONGER = 4


@dataclass(frozen=True, kw_only=True)
class PlanQuery:
    """The question: a model under traffic with these lengths, both SLOs at p99. The traffic is one
    of `rate` (Poisson arrivals, requests/s) or `concurrency` (a closed loop of that many clients,
    each sending its next request the moment its last one ends: `vllm bench serve --max-concurrency`
    at an unbounded rate, a benchmark's N users)."""

    model: str
    rate: float | None = None  # requests/s
    concurrency: int | None = None  # clients
    input_tokens: int
    output_tokens: int
    ttft_slo_ms: float
    tpot_slo_ms: float
    devices: tuple[str, ...] = ("h100", "h200", "b200")
    max_gpus: int = 64
    gpu_hour_usd: tuple[tuple[str, float], ...] = ()  # (device, price); defaults from constants
    input_range_ratio: float = 0.0
    dtypes: tuple[str, ...] = ("bf16", "fp8", "fp4")
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2)
    batch_slots: tuple[int, ...] = (64, 256, 1024)
    disaggregation: bool = True
    duration_s: float = 10.0  # simulated arrivals per candidate (bounded by MIN/MAX_REQUESTS)
    seed: int = 0

    MIN_REQUESTS = 200  # a p99 from at least 200 requests
    MAX_REQUESTS = 2000

    def price(self, device: str) -> float:
        given = dict(self.gpu_hour_usd)
        if device in given:
            return given[device]
        if device not in C.GPU_HOUR_USD:
            raise SimConfigError(f"no default price for {device}: give it with --gpu-hour-usd {device}=<USD per GPU-hour>")
        return C.GPU_HOUR_USD[device]

    def confirming(self) -> PlanQuery:
        """The same question asked CONFIRM_LONGER times as long: the chosen shape's own re-run."""
        return dataclasses.replace(self, duration_s=self.duration_s * CONFIRM_LONGER)

    @property
    def slo_request_s(self) -> float:
        """The longest a request of the mean lengths may take and meet both targets."""
        return (self.ttft_slo_ms + (self.output_tokens - 1) * self.tpot_slo_ms) / 1000

    @property
    def required_rate(self) -> float:
        """The requests/s a shape must finish: the rate, or, for a closed loop, what its clients
        send when each request takes slo_request_s (Little's law: in flight = rate x latency);
        a shape that finishes fewer keeps a request longer than both targets allow."""
        return self.rate if self.rate is not None else (self.concurrency or 0) / self.slo_request_s

    @property
    def num_requests(self) -> int:
        """duration_s of arrivals: under a rate, rate x duration_s; in a closed loop, what its
        clients send in duration_s at the required rate (on a shape that meets the targets the run
        takes at most duration_s, its requests being quicker)."""
        return max(self.MIN_REQUESTS, min(self.MAX_REQUESTS, round(self.required_rate * self.duration_s)))

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> PlanQuery:
        """A web page's JSON query; InvalidParamError names the field that is wrong."""
        if not isinstance(body, dict):
            raise InvalidParamError("body", "must be a JSON object")
        unknown = set(body) - set(BODY_FIELDS)
        if unknown:
            raise InvalidParamError(min(unknown), f"unknown; a plan takes {', '.join(BODY_FIELDS)}")
        fields: dict[str, Any] = {}
        for name, value in body.items():
            if value is None and name in ("rate", "concurrency"):
                continue  # the other one of the two is the traffic (a plan's own query says null)
            kind = BODY_FIELDS[name]
            try:
                if kind is tuple:  # a list of names, or device -> price
                    value = tuple(sorted((str(k).lower(), float(v)) for k, v in value.items())) if name == "gpu_hour_usd" \
                        else tuple(str(v).lower() for v in value)
                else:
                    value = kind(value)
            except (TypeError, ValueError, AttributeError):
                raise InvalidParamError(name, f"must be {'a list' if kind is tuple else kind.__name__}") from None
            fields[name] = value
        for name in ("model", "input_tokens", "output_tokens", "ttft_slo_ms", "tpot_slo_ms"):
            if name not in fields:
                raise InvalidParamError(name, "is required")
        query = cls(**fields)
        try:
            query.check()
        except SimConfigError as err:
            raise InvalidParamError(_field_named(str(err)), str(err)) from None
        return query

    def check(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            given = "not both" if self.rate is not None else "one is required"
            raise SimConfigError(f"the traffic is --rate (requests/s) or --concurrency (clients): {given}")
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise SimConfigError("--rate must be a positive, finite number of requests/s")
        if self.concurrency is not None and self.concurrency < 1:
            raise SimConfigError("--concurrency must be at least 1")
        if self.ttft_slo_ms <= 0 or self.tpot_slo_ms <= 0:
            raise SimConfigError("--ttft-slo-ms and --tpot-slo-ms must be positive")
        if self.input_tokens < 1 or self.output_tokens < 2:
            raise SimConfigError("--input-tokens must be at least 1 and --output-tokens at least 2 (a TPOT needs two)")
        if not 1 <= self.max_gpus <= MAX_GPUS or self.duration_s <= 0:
            raise SimConfigError(f"--max-gpus must be from 1 to {MAX_GPUS} and --duration-s positive")
        if not 0 <= self.input_range_ratio < 1:
            raise SimConfigError("--input-range-ratio must be in [0, 1)")
        if self.model not in MODEL_NAMES:
            raise SimConfigError(f"--model {self.model!r}: choose one of {', '.join(MODEL_NAMES)}")
        bad = [d for d in self.devices if d not in DEVICE_NAMES] or [t for t in self.dtypes if t not in WEIGHT_DTYPES]
        if bad or not self.devices or not self.dtypes:
            raise SimConfigError(f"--devices and --dtypes: {bad[0] if bad else 'none given'} is not one of "
                                 f"{', '.join(DEVICE_NAMES)} / {', '.join(WEIGHT_DTYPES)}")
        for device in self.devices:
            self.price(device)


# What a page's plan body may hold, and each field's type (lists arrive as JSON lists).
BODY_FIELDS: dict[str, type] = {
    "model": str, "rate": float, "concurrency": int, "input_tokens": int, "output_tokens": int, "ttft_slo_ms": float,
    "tpot_slo_ms": float, "devices": tuple, "max_gpus": int, "gpu_hour_usd": tuple, "input_range_ratio": float, "dtypes": tuple,
    "disaggregation": bool, "seed": int,
}  # fmt: skip


def _field_named(message: str) -> str:
    """The field a CLI-worded refusal names ("--ttft-slo-ms must ..." -> ttft_slo_ms)."""
    for word in message.split():
        if word.startswith("--") and word[2:].replace("-", "_") in BODY_FIELDS:
            return word[2:].replace("-", "_")
    return "body"


@dataclass(frozen=True)
class Shape:
    """One candidate deployment. prefill_replicas 0: aggregated (every replica prefills and
    decodes); otherwise that many replicas prefill and the rest decode."""

    device: str
    dtype: str
    tp: int
    pp: int
    replicas: int
    max_num_seqs: int
    prefill_replicas: int = 0

    @property
    def kv_dtype(self) -> str:
        """FP8 and FP4 deployments keep an FP8 KV cache, as their serving recipes do."""
        return "bf16" if self.dtype == "bf16" else "fp8"

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.replicas

    @property
    def family(self) -> str:
        """A frontier curve: device, precision and whether prefill and decode are split."""
        return f"{self.device} {self.dtype} {'disaggregated' if self.prefill_replicas else 'aggregated'}"

    def spec(self, q: PlanQuery) -> SimSpec:
        split = {}
        if self.prefill_replicas:
            group = self.tp * self.pp
            split = {"prefill_gpus": self.prefill_replicas * group, "decode_gpus": (self.replicas - self.prefill_replicas) * group}
        return SimSpec(
            model=q.model, device=self.device, gpus=self.gpus, tp=self.tp, pp=self.pp, dtype=self.dtype,
            kv_dtype=self.kv_dtype, input_tokens=q.input_tokens, output_tokens=q.output_tokens,
            input_range_ratio=q.input_range_ratio, num_requests=q.num_requests, seed=q.seed,
            rate=float("inf") if q.rate is None else q.rate, concurrency=q.concurrency,
            max_num_seqs=self.max_num_seqs, ttft_slo_ms=q.ttft_slo_ms, tpot_slo_ms=q.tpot_slo_ms, **split,
        )  # fmt: skip

    def to_json(self) -> dict[str, object]:
        return asdict(self) | {"kv_dtype": self.kv_dtype, "gpus": self.gpus, "family": self.family}


@dataclass(frozen=True)
class Bound:
    """A replica's analytic limits: the most requests/s it could finish (prefill and decode
    together, or each alone) and the least time one request could take, alone on it."""

    request_s: float
    prefill_request_s: float
    decode_request_s: float
    alone_s: float


def replica_bound(dep: Deployment, max_num_seqs: int, q: PlanQuery) -> Bound:
    """Upper bounds on throughput from the cost model's own step prices: decode at the largest batch
    the slots and the KV allow (a step's time per sequence only falls as the batch grows), every
    stage busy at once, and a prompt's GEMMs at compute speed with no weight read."""
    from engine.config import EngineConfig

    cost = CostModel(dep)
    config = EngineConfig(max_num_seqs=max_num_seqs)
    blocks = dep.plan_memory(config).num_blocks
    per_request = q.input_tokens + q.output_tokens
    batch = min(max_num_seqs, blocks * config.block_size // per_request)
    if batch < 1:
        raise SimConfigError(f"{dep.tp * dep.pp} x {dep.device.name} hold no KV for one {per_request}-token request")
    context = q.input_tokens + q.output_tokens // 2
    step = cost.step(StepShape(batch, batch, batch, batch * context)).total_s
    decode_tok_s = batch * dep.pp / step
    prefill_s = 2 * q.input_tokens * cost.linear_params / cost.gemm_flops / dep.pp
    out = q.output_tokens
    alone = cost.step(StepShape(q.input_tokens, 1)).total_s + (out - 1) * cost.step(StepShape(1, 1, 1, context)).total_s
    return Bound(1 / (prefill_s + out / decode_tok_s), 1 / prefill_s, decode_tok_s / out, alone)


@dataclass
class Space:
    """The shapes to simulate, and how many the bound set aside and why."""

    shapes: list[Shape]
    enumerated: int = 0
    unfit: int = 0  # the model does not fit, or the TP/PP split is impossible
    too_slow: int = 0  # even the bound cannot keep up with the traffic
    idle: int = 0  # more replicas than requests in flight at once (Little's law)


def _replica_counts(group: int, q: PlanQuery) -> list[int]:
    return [n for n in REPLICA_GRID if n * group <= q.max_gpus]


def _splits(replicas: int, q: PlanQuery, bound: Bound) -> list[int]:
    """Prefill replicas of a fleet of `replicas`: 0 (aggregated), then, split, the count that
    balances the two pools' bounds (a prefill replica's requests/s against a decode replica's)."""
    if not q.disaggregation or replicas < 2:
        return [0]
    share = bound.decode_request_s / (bound.prefill_request_s + bound.decode_request_s)
    return [0, min(replicas - 1, max(1, round(replicas * share)))]


def search_space(q: PlanQuery) -> Space:
    """Every shape of the query's dimensions, pruned only by what the bound proves."""
    space = Space([])
    for device in q.devices:
        for dtype in q.dtypes:
            for tp in q.tp:
                for pp in q.pp:
                    for slots in q.batch_slots:
                        _add_shapes(space, q, device, dtype, tp, pp, slots)
    return space


def _add_shapes(space: Space, q: PlanQuery, device: str, dtype: str, tp: int, pp: int, slots: int) -> None:
    counts = _replica_counts(tp * pp, q)
    if not counts:
        return
    try:
        bound = replica_bound(Shape(device, dtype, tp, pp, 1, slots).spec(q).deployment(), slots, q)
    except (SimConfigError, InvalidParamError):
        n = sum(2 if q.disaggregation and c > 1 else 1 for c in counts)
        space.enumerated += n
        space.unfit += n
        return
    shapes = [Shape(device, dtype, tp, pp, n, slots, p) for n in counts for p in _splits(n, q, bound)]
    space.enumerated += len(shapes)
    # Little's law: more replicas than the requests in flight, each alone on its replica, leaves
    # replicas idle and no request faster. A closed loop never has more in flight than its
    # clients; under a rate, about twice rate x the least a request takes.
    if q.concurrency is not None:
        most_useful = q.concurrency
    else:
        most_useful = math.ceil(2 * q.required_rate * bound.alone_s) + 1
    for shape in shapes:
        if shape.replicas > most_useful:
            space.idle += 1
        elif _capacity(bound, shape.replicas, shape.prefill_replicas) * BOUND_MARGIN < q.required_rate:
            space.too_slow += 1
        else:
            space.shapes.append(shape)


def _capacity(bound: Bound, replicas: int, prefill: int) -> float:
    if not prefill:
        return replicas * bound.request_s
    return min(prefill * bound.prefill_request_s, (replicas - prefill) * bound.decode_request_s)
