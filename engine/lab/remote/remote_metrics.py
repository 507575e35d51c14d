"""A remote server's /metrics, read onto the live snapshot's keys (the ones the pages chart).

`read_exposition` maps one scrape, in vLLM's names (`vllm:*`, older ones too), SGLang's
(`sglang:*`) or ServeLab's (vLLM's plus `servelab_*`), onto one RemoteReading of named
quantities: gauges, counters, cumulative histograms, and what the info metrics reveal about the
remote's configuration. Series labelled by model_name and engine are summed across the engines
of the lab's model (a fraction such as KV usage is averaged). `RemoteWindow` keeps the readings
of the last WINDOW_S seconds and turns them into a snapshot: counters into rates and totals,
histograms into windowed percentiles from the bucket deltas (interpolated inside the bucket, as
Prometheus's histogram_quantile does), exactly the window the local metrics bus uses. A key the
remote does not expose is None, and `missing` says which, so the page can name them."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any

from engine.serving.telemetry.metrics import WINDOW_S
from engine.serving.telemetry.prometheus_text import Exposition, Sample, histogram_quantile

GAUGES = ("running", "waiting", "kv_usage", "prefix_hit_rate", "gen_throughput")
FRACTIONS = ("kv_usage", "prefix_hit_rate")  # averaged across engines, not summed
COUNTERS = ("preemptions", "prefix_queries", "prefix_hits", "generation_tokens", "prompt_tokens")
HISTOGRAMS = ("ttft", "itl", "e2e", "queue_time")

# Candidate names per quantity, newest first; the first one present in a scrape is used.
VLLM_NAMES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "preemptions": ("vllm:num_preemptions_total",),
    "prefix_queries": ("vllm:prefix_cache_queries_total",),
    "prefix_hits": ("vllm:prefix_cache_hits_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue_time": ("vllm:request_queue_time_seconds",),
}
SGLANG_NAMES: dict[str, tuple[str, ...]] = {
    "running": ("sglang:num_running_reqs",),
    "waiting": ("sglang:num_queue_reqs",),
    "kv_usage": ("sglang:token_usage",),
    "prefix_hit_rate": ("sglang:cache_hit_rate",),
    "gen_throughput": ("sglang:gen_throughput",),
    "generation_tokens": ("sglang:generation_tokens_total",),
    "prompt_tokens": ("sglang:prompt_tokens_total",),
    "ttft": ("sglang:time_to_first_token_seconds",),
    "itl": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    "e2e": ("sglang:e2e_request_latency_seconds",),
    "queue_time": ("sglang:queue_time_seconds",),
}
FLAVOUR_NAMES = {"vLLM": VLLM_NAMES, "SGLang": SGLANG_NAMES, "ServeLab": VLLM_NAMES}
CACHE_INFO = "vllm:cache_config_info"  # an info gauge whose labels carry the cache config
REJECTIONS = {  # counters of refused requests by reason, onto the rejected chart's reasons
    "vllm:admission_rejections_total": {"max_num_queued_reqs": "queue_full", "max_num_queued_tokens": "queue_full"},
    "servelab_rejected_requests_total": {},  # ServeLab's reasons are the chart's own
}
SERVELAB_COUNTERS = ("streams_cut_mid_stream", "scale_changes_total", "replicas_ordered_total")
# What a chart is missing, by snapshot key, when the quantity behind it is not in the scrape.
NEEDS = {
    "running": "running",
    "queue_depth": "waiting",
    "kv_used_blocks": "kv_usage",
    "ttft_p50": "ttft",
    "itl_p50": "itl",
    "e2el_p50": "e2e",
    "queue_time_p50": "queue_time",
    "tokens_per_s": "generation_tokens",
    "preempted": "preemptions",
    "prefix_hit_rate": "prefix_queries",
}


def detect_flavour(names: set[str], owned_by: str | None = None) -> str | None:
    """Which server this is, from its metric prefixes (ServeLab speaks vllm:* plus servelab_*),
    else from /v1/models' owned_by; None when neither says."""
    if any(n.startswith("servelab_") for n in names):
        return "ServeLab"
    if any(n.startswith("vllm:") for n in names):
        return "vLLM"
    if any(n.startswith("sglang:") for n in names):
        return "SGLang"
    return {"vllm": "vLLM", "sglang": "SGLang", "servelab": "ServeLab"}.get((owned_by or "").lower())


@dataclass
class RemoteReading:
    """One scrape, mapped: every quantity the remote exposed (an absent one is not a key)."""

    time: float
    flavour: str | None = None
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, dict[float, float]] = field(default_factory=dict)  # upper bound -> cumulative
    rejected: dict[str, float] = field(default_factory=dict)
    replicas: dict[str, int] | None = None  # ServeLab's replicas by state
    servelab: dict[str, float] = field(default_factory=dict)  # its scaling counters
    engines: int = 0  # distinct `engine` label values (vLLM's data-parallel engines)
    info: dict[str, str] = field(default_factory=dict)  # cache_config_info's labels

    def quantities(self) -> set[str]:
        return set(self.gauges) | set(self.counters) | set(self.histograms)


def read_exposition(
    scrape: Exposition, now: float, model: str | None = None, owned_by: str | None = None
) -> RemoteReading:
    """Map one scrape onto RemoteReading, keeping only the series of `model` where a series
    names its model (model_name), and summing across engines."""
    names = scrape.names()
    flavour = detect_flavour(names, owned_by)
    reading = RemoteReading(now, flavour)
    by_name: dict[str, list[Sample]] = {}
    for sample in scrape.samples:
        if model is None or sample.labels.get("model_name", model) == model:
            by_name.setdefault(sample.name, []).append(sample)
    # A remote whose prefixes say nothing is tried under both maps.
    maps = [FLAVOUR_NAMES[flavour]] if flavour else [VLLM_NAMES, SGLANG_NAMES]
    for quantity in (*GAUGES, *COUNTERS, *HISTOGRAMS):
        for name in (n for names_map in maps for n in names_map.get(quantity, ())):
            if quantity in HISTOGRAMS:
                buckets = _buckets(by_name.get(name + "_bucket", []))
                if buckets:
                    reading.histograms[quantity] = buckets
                    break
            elif name in by_name:
                values = [s.value for s in by_name[name] if not math.isnan(s.value)]
                if not values:
                    continue
                if quantity in GAUGES:
                    reading.gauges[quantity] = sum(values) / len(values) if quantity in FRACTIONS else sum(values)
                else:
                    reading.counters[quantity] = sum(values)
                break
    for name, reasons in REJECTIONS.items():
        for sample in by_name.get(name, []):
            reason = reasons.get(sample.labels.get("reason", ""), sample.labels.get("reason", "other"))
            reading.rejected[reason] = reading.rejected.get(reason, 0.0) + sample.value
    states = by_name.get("servelab_replicas", [])
    if states:
        reading.replicas = {s.labels.get("state", "ready"): int(s.value) for s in states}
    for key in SERVELAB_COUNTERS:
        name = f"servelab_{key.removesuffix('_total')}_total"
        if name in by_name:
            reading.servelab[key] = sum(s.value for s in by_name[name])
    reading.engines = len({s.labels["engine"] for s in scrape.samples if "engine" in s.labels})
    info = by_name.get(CACHE_INFO) or scrape.series(CACHE_INFO)
    if info:
        reading.info = dict(info[0].labels)
        blocks = [_number(s.labels.get("num_gpu_blocks")) for s in info]
        if all(b is not None for b in blocks):  # every engine's blocks: the fleet's total
            reading.info["num_gpu_blocks"] = str(int(sum(blocks)))  # type: ignore[arg-type]
    return reading


def _buckets(samples: list[Sample]) -> dict[float, float]:
    """Cumulative counts by upper bound, summed across engines."""
    out: dict[float, float] = {}
    for sample in samples:
        bound = _number(sample.labels.get("le"))
        if bound is not None:
            out[bound] = out.get(bound, 0.0) + sample.value
    return out if math.inf in out else {}


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "", "None") else None  # type: ignore[arg-type]
    except ValueError:
        return None


@dataclass
class RemoteSnapshot:
    """A remote server's metrics over the window, in the live snapshot's names: the remote lab's
    reading (FleetSnapshot's sibling; engine/lab/facade.py Reading). None where the remote does not
    expose a quantity or the window saw nothing; `missing` names the keys its metrics cannot fill
    at all, so the page can say so. Unlike a fleet of ours it has e2el_*, prompt_tokens_per_s and
    `missing`, and no stage_idle. to_json() is the stream's `metrics` payload at its core; the
    fields' order is the payload's."""

    queue_depth: int | None = None
    running: int | None = None
    waiting: int | None = None
    kv_used_blocks: int | None = None
    kv_total_blocks: int | None = None
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    ttft_p999: float | None = None
    ttft_max: float | None = None
    itl_p50: float | None = None
    itl_p99: float | None = None
    e2el_p50: float | None = None
    e2el_p99: float | None = None
    queue_time_p50: float | None = None
    queue_time_p99: float | None = None
    tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    preempted: int | None = None
    batch_size: int | None = None
    allreduce_ms: float | None = None
    max_num_seqs: int | None = None
    prefix_hit_rate: float | None = None
    wasted_tokens_per_s: float | None = None  # the lab's own (its proxy's orphaned chunks), set by the lab
    expired_prefill_tokens: int | None = None
    streams_cut_mid_stream: int | None = None
    scale_changes_total: int | None = None
    replicas_ordered_total: int | None = None
    rejected: dict[str, int] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)
    replica_queue_depths: list[int] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    time: float = 0.0  # the lab's clock when it composed the reading

    def unfilled(self) -> list[str]:
        """The keys with no value: what a page is missing while the remote's metrics are down."""
        return sorted(f.name for f in fields(self) if getattr(self, f.name) is None)

    def to_json(self) -> dict[str, Any]:
        return {f.name: _copied(getattr(self, f.name)) for f in fields(self)}


def _copied(value: Any) -> Any:
    """dicts and lists copied: a consumer may add to its payload."""
    return dict(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value


class RemoteWindow:
    """The readings of the last `window_s` seconds; snapshot() reads them as the live bus does."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.readings: deque[RemoteReading] = deque()

    def add(self, reading: RemoteReading) -> None:
        if self.readings and _restarted(self.readings[-1], reading):
            # The remote restarted since the last scrape: its counters began again at zero, so
            # the window counts from zero, at the last time it was seen before.
            last = self.readings[-1].time
            self.readings.clear()
            self.readings.append(RemoteReading(last))
        self.readings.append(reading)
        # Keep one reading from before the window began: the baseline its deltas start from.
        while len(self.readings) > 2 and reading.time - self.readings[1].time >= self.window_s:
            self.readings.popleft()

    def clear(self) -> None:
        self.readings.clear()

    def snapshot(self) -> RemoteSnapshot:
        """The snapshot keys the remote's metrics can fill (None where it does not expose them or
        the window saw nothing), and `missing`: the keys its metrics cannot fill at all."""
        if not self.readings:
            return RemoteSnapshot()  # every key None
        new = self.readings[-1]
        base = self.readings[0] if len(self.readings) > 1 else None
        span = new.time - base.time if base is not None else 0.0
        g, c = new.gauges, new.counters
        blocks = _number(new.info.get("num_gpu_blocks"))
        usage = g.get("kv_usage")
        if blocks and usage is not None:
            used, total = round(usage * blocks), int(blocks)
        elif usage is not None:  # no block count revealed: the chart shows percent of the cache
            used, total = round(usage * 100), 100
        else:
            used = total = None
        snap = RemoteSnapshot(
            queue_depth=_int(g.get("waiting")),
            running=_int(g.get("running")),
            batch_size=_int(g.get("running")),  # a remote's batch is what it runs
            kv_used_blocks=used,
            kv_total_blocks=total,
            preempted=_int(c.get("preemptions")),
            rejected={k: int(v) for k, v in new.rejected.items()},
            tokens_per_s=self._rate(base, new, span, "generation_tokens"),
            prompt_tokens_per_s=self._rate(base, new, span, "prompt_tokens"),
            replicas=new.replicas if new.replicas is not None else {"ready": max(1, new.engines)},
        )
        if snap.tokens_per_s is None and "gen_throughput" in g:
            snap.tokens_per_s = g["gen_throughput"]
        for quantity, key in (("ttft", "ttft"), ("itl", "itl"), ("e2e", "e2el"), ("queue_time", "queue_time")):
            delta = _delta(base, new, quantity)
            setattr(snap, f"{key}_p50", None if delta is None else histogram_quantile(0.5, delta))
            setattr(snap, f"{key}_p99", None if delta is None else histogram_quantile(0.99, delta))
        ttft = _delta(base, new, "ttft")
        snap.ttft_p999 = None if ttft is None else histogram_quantile(0.999, ttft)
        queries = self._delta_counter(base, new, "prefix_queries")
        hits = self._delta_counter(base, new, "prefix_hits")
        if queries is not None and hits is not None:
            snap.prefix_hit_rate = hits / queries if queries > 0 else 0.0
        elif "prefix_hit_rate" in g:
            snap.prefix_hit_rate = g["prefix_hit_rate"]
        for key in SERVELAB_COUNTERS:
            setattr(snap, key, _int(new.servelab.get(key)))
        exposed = new.quantities()
        snap.missing = sorted(
            key
            for key, quantity in NEEDS.items()
            if quantity not in exposed
            and not (key == "tokens_per_s" and "gen_throughput" in exposed)
            and not (key == "prefix_hit_rate" and "prefix_hit_rate" in exposed)
        )
        if usage is not None and not blocks:
            snap.missing.append("kv_total_blocks")
        # No remote's metrics say these: its queue is one number, its steps are its own.
        snap.missing += ["allreduce_ms", "max_num_seqs", "waiting", "stage_idle"]
        snap.missing += [key for key in SERVELAB_COUNTERS if key not in new.servelab]
        return snap

    @staticmethod
    def _delta_counter(base: RemoteReading | None, new: RemoteReading, key: str) -> float | None:
        if base is None or key not in new.counters:
            return None
        return new.counters[key] - base.counters.get(key, 0.0)

    def _rate(self, base: RemoteReading | None, new: RemoteReading, span: float, key: str) -> float | None:
        delta = self._delta_counter(base, new, key)
        return None if delta is None or span <= 0 else delta / span


def _delta(base: RemoteReading | None, new: RemoteReading, quantity: str) -> list[tuple[float, float]] | None:
    """The histogram's buckets over the window: the newest cumulative counts less the baseline's."""
    if base is None or quantity not in new.histograms:
        return None
    old = base.histograms.get(quantity, {})
    return [(bound, count - old.get(bound, 0.0)) for bound, count in new.histograms[quantity].items()]


def _restarted(old: RemoteReading, new: RemoteReading) -> bool:
    """A counter or bucket that went down: the remote started over."""
    if any(new.counters.get(k, v) < v for k, v in old.counters.items()):
        return True
    for quantity, buckets in old.histograms.items():
        fresh = new.histograms.get(quantity)
        if fresh is not None and any(fresh.get(b, c) < c for b, c in buckets.items()):
            return True
    return False


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)

