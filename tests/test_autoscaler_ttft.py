"""The autoscaler's fourth signal, p99 TTFT against ttft_target_ms, on virtual time. First a fake
fleet whose load is a table by ready replicas (slots, KV, TTFT), with the metrics' sliding window
of first tokens, so the p99 it reports lags a capacity change as the real bus's does; then the
simulated lab (the real Fleet, Router and Autoscaler over SimReplicas). Queue, slots and KV stay
under their thresholds throughout: only TTFT can move the fleet."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import pytest

from engine.clock import VirtualClock
from engine.lab.simulated.lab_sim import SimLab
from engine.levers import LEVERS
from engine.serving.scaling.autoscaler import Autoscaler, AutoscalerConfig, Decision
from engine.serving.telemetry.metrics import WINDOW_S, window_percentile
from engine.serving.telemetry.snapshot import FleetSnapshot
from tests.support.autoscaler_fakes import FakeFleet, play, scaler

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class LoadAt:
    """What a steady load looks like on a fleet of some number of ready replicas."""

    slot_util: float
    kv_util: float
    ttft_s: float | None  # None: no request got its first token


# One replica misses a 1500 ms target; two meet it, but not by half: two is the right size.
STEADY = {1: LoadAt(0.5, 0.5, 2.4), 2: LoadAt(0.25, 0.25, 1.0)}


class LoadedFleet(FakeFleet):
    """A FakeFleet under a steady load: each snapshot reads the load of its ready count and
    reports p99 TTFT over the last WINDOW_S of first tokens, as MetricsBus.snapshot does."""

    def __init__(self, clock: VirtualClock, load: dict[int, LoadAt], ready: int = 1) -> None:
        super().__init__(clock, ready=ready)
        self.load = load
        self.first_tokens: list[tuple[float, float]] = []  # (when, TTFT s)

    def snapshot(self) -> FleetSnapshot:
        now, at = self.clock.now(), self.load[max(1, self.ready)]
        self.slot_util, self.kv_util = at.slot_util, at.kv_util
        if at.ttft_s is not None:
            self.first_tokens.append((now, at.ttft_s))
        self.first_tokens = [(t, v) for t, v in self.first_tokens if now - t <= WINDOW_S]
        p99 = window_percentile(sorted(v for _, v in self.first_tokens), 99)
        return replace(super().snapshot(), ttft_p99=p99)


def loaded(load: dict[int, LoadAt] = STEADY, **config: Any) -> tuple[LoadedFleet, Autoscaler]:
    fleet = LoadedFleet(VirtualClock(), load)
    return fleet, scaler(fleet, **config)


def test_ttft_over_target_scales_up_when_queue_slots_and_kv_do_not() -> None:
    fleet, auto = loaded(ttft_target_ms=1500)
    taken = play(auto, fleet, 40, queued=2)  # 2 queued, 50% slots and KV: all under their thresholds
    # The first tick starts the settle window (one metrics window), then 5 s of pressure orders one.
    assert taken == [(0.5 + WINDOW_S + 5.0, Decision(1, "p99 TTFT 2400 ms > target 1500 ms for 5 s: +1"))]
    assert fleet.events.recent("scale")[-1]["message"] == "p99 TTFT 2400 ms > target 1500 ms for 5 s: +1 (1 ordered)"
    # While it starts the same TTFT orders nothing more: it holds once, saying why.
    taken = play(auto, fleet, 60)
    assert [d for _, d in taken] == [
        Decision(0, "p99 TTFT 2400 ms > target 1500 ms for 5 s: holding, 1 already starting")
    ]
    assert (fleet.ready, fleet.starting) == (1, 1)


def test_a_fleet_that_meets_the_target_holds_its_size_without_flapping() -> None:
    fleet, auto = loaded(ttft_target_ms=1500)
    assert [d.delta for _, d in play(auto, fleet, 40, queued=0)] == [1]
    fleet.become_ready()
    # Two replicas: queue empty, slots and KV 25% (calm by those), TTFT 1000 ms (under target, over
    # half). For a metrics window the p99 still holds one replica's 2400 ms; then ten quiet minutes.
    sizes = []
    for _ in range(40):  # 40 x 15 s: twenty down windows, a hundred and twenty up windows
        assert play(auto, fleet, 15) == []
        sizes.append((fleet.ready, fleet.starting, fleet.draining))
    assert set(sizes) == {(2, 0, 0)}
    assert auto.status()["calm_for_s"] is None  # TTFT between half and the target is never calm


def test_well_under_half_the_target_drains_after_the_long_window() -> None:
    fast = {1: LoadAt(0.2, 0.2, 0.5), 2: LoadAt(0.1, 0.1, 0.3)}
    fleet = LoadedFleet(VirtualClock(), fast, ready=2)
    auto = scaler(fleet, ttft_target_ms=1500)
    taken = play(auto, fleet, 32, queued=0)
    assert [d for _, d in taken] == [
        Decision(
            -1,
            "queue empty, slots 10% <= 30%, KV 10% <= 30%, p99 TTFT 300 ms <= 750 ms for 30 s: -1 (drain one of 2 ready)",
        )
    ]


@pytest.mark.parametrize("target", [None, 0])
def test_without_a_target_the_same_ttft_does_not_scale(target: float | None) -> None:
    fleet, auto = loaded(ttft_target_ms=target)
    assert play(auto, fleet, 600, queued=2) == []
    assert (fleet.ready, fleet.starting) == (1, 0)


def test_no_first_token_in_the_window_says_nothing() -> None:
    """Target set, no TTFT data: no order, and the other signals' calm alone drains."""
    idle = {1: LoadAt(0.0, 0.0, None), 2: LoadAt(0.0, 0.0, None)}
    fleet = LoadedFleet(VirtualClock(), idle, ready=2)
    auto = scaler(fleet, ttft_target_ms=10)
    taken = play(auto, fleet, 32, queued=0)
    assert [d.delta for _, d in taken] == [-1] and "TTFT" not in taken[0][1].reason


def test_the_target_comes_from_the_lever_and_applies_live() -> None:
    config = AutoscalerConfig.from_levers({"max_replicas": 4, "ttft_target_ms": 1500, "queue_cap": 64})
    assert (config.max_replicas, config.ttft_target_ms) == (4, 1500)
    fleet = LoadedFleet(VirtualClock(), STEADY)
    auto = Autoscaler(fleet, config, clock=fleet.clock)
    auto.reconfigure(ttft_target_ms=3000)  # 2400 ms now meets it
    assert play(auto, fleet, 60, queued=0) == []
    auto.reconfigure(ttft_target_ms=2000)
    (_, decision), *_ = play(auto, fleet, 6)
    assert decision.reason == "p99 TTFT 2400 ms > target 2000 ms for 5 s: +1"


# the real Fleet, Router and Autoscaler over simulated replicas (engine/lab/simulated/lab_sim.py) -----------

LONG_PROMPTS: dict[str, Any] = {
    "executor": "sim",
    "model": "llama-3.1-8b",
    "device": "h100",
    "gpu_count": 2,
    "max_replicas": 2,
    "prompt_tokens": 16000,
    "output_tokens": 32,
    "max_batched_tokens": 512,
    "request_rate": 1.0,
    "provision_delay_s": 2.0,
}


def run_sim_lab(ttft_target_ms: int, until_s: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Long prompts at 1 req/s on one 8B replica: every 5 simulated seconds' snapshot until the
    first scale-up (or the end), and the scale events that moved the fleet."""
    levers = {key: lever.default for key, lever in LEVERS.items()} | LONG_PROMPTS | {"ttft_target_ms": ttft_target_ms}
    sim = SimLab(levers, lambda snap: None)
    sim.start_traffic()
    try:
        one_replica = []
        while sim.clock.now() < until_s:
            sim.loop.run(until=sim.clock.now() + 5.0)
            snap = sim.fleet.snapshot()
            if len(snap.replicas) == 1:  # only "ready": nothing ordered yet
                one_replica.append(snap)
        return one_replica, [e for e in sim.events.recent("scale") if e["delta"]]
    finally:
        sim.stop()


def test_the_simulated_lab_scales_on_ttft_alone() -> None:
    one_replica, scaled = run_sim_lab(1500, until_s=120.0)
    assert [e["delta"] for e in scaled] == [1]
    assert re.match(r"p99 TTFT \d+ ms > target 1500 ms for 5 s: \+1 \(cold start", scaled[0]["message"]), scaled
    # Before the order the other signals were far from their thresholds (queue 8 per replica, 90%).
    assert one_replica and all(s.queue_depth + s.waiting <= 4 for s in one_replica)
    assert all(s.batch_size / s.max_num_seqs < 0.9 > s.kv_used_blocks / s.kv_total_blocks for s in one_replica)
    # The same load under a target it meets orders nothing: TTFT was the only reason.
    _, scaled = run_sim_lab(60_000, until_s=120.0)
    assert scaled == []
