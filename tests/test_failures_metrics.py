"""The snapshot keys of the queue, router and scheduler rows (issue 15, part B) on the metrics bus
and a virtual clock: numbers in every snapshot, the prefix hit rate over the sliding window, and
the replicas' deadline drops counted with the router's."""

from __future__ import annotations

import pytest

from engine.clock import VirtualClock
from engine.core.sequence import RequestTimes
from engine.serving.replicas.messages import ReplicaStats, StepMessage, TokenDelta
from engine.serving.telemetry.metrics import WINDOW_S, MetricsBus

pytestmark = pytest.mark.unit

KEYS = ("expired_prefill_tokens", "ttft_max", "ttft_p999", "prefix_hit_rate")


def stats(queries: int, hits: int, expired: int = 0, expired_prefill: int = 0) -> ReplicaStats:
    return ReplicaStats(
        prefix_cache_queries=queries, prefix_cache_hits=hits, num_expired=expired, expired_prefill_tokens=expired_prefill
    )


def test_every_key_is_a_number_before_any_traffic() -> None:
    snap = MetricsBus(VirtualClock()).snapshot()
    assert all(isinstance(getattr(snap, key), (int, float)) and getattr(snap, key) == 0 for key in KEYS)


def test_prefix_hit_rate_is_over_the_window_only() -> None:
    clock = VirtualClock()
    bus = MetricsBus(clock)
    bus.observe(StepMessage(0, clock.now(), stats=stats(1000, 900)))
    bus.observe(StepMessage(1, clock.now(), stats=stats(1000, 100)))
    assert bus.snapshot().prefix_hit_rate == 0.5  # both replicas: 1,000 of 2,000 tokens
    clock.advance(WINDOW_S + 1)
    bus.observe(StepMessage(0, clock.now(), stats=stats(2000, 900)))  # 1,000 more, none found
    assert bus.snapshot().prefix_hit_rate == 0.0
    bus.forget(0)  # a retired replica's totals stay counted: the rate does not jump
    assert bus.snapshot().prefix_hit_rate == 0.0


def test_ttft_tail_and_deadline_counters() -> None:
    clock = VirtualClock()
    bus = MetricsBus(clock)
    for i in range(1000):
        times = RequestTimes(arrival=0.0, first_token=0.1 if i < 998 else 5.0 + i, tokens=[0.1])
        bus.observe(StepMessage(0, 0.1, [TokenDelta(f"r{i}", [1], "", False, None, 4, 0, times, True)]))
    bus.observe(StepMessage(0, 0.2, stats=stats(0, 0, expired=3, expired_prefill=480)))
    snap = bus.snapshot(rejected={"deadline": 2})
    assert snap.ttft_max == 5.0 + 999 and snap.ttft_p999 == 5.0 + 998 and snap.ttft_p50 == 0.1
    assert snap.expired_prefill_tokens == 480
    assert snap.rejected["deadline"] == 2 + 3  # the router's, and the replicas' own drops
    assert "servelab_expired_prefill_tokens_total 480" in bus.prometheus_text("m")
