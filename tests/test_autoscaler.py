"""The autoscaler's decisions on recorded signal traces and a fake clock: no processes, no sleeps.
A fake fleet (tests/support/autoscaler_fakes.py) turns scale_up into replicas "starting" and
scale_down into one "draining", so the tests see exactly what the autoscaler ordered and when."""

from __future__ import annotations

import pytest

from engine.clock import VirtualClock
from engine.serving.scaling.autoscaler import Autoscaler, AutoscalerConfig, Decision, Signals
from engine.serving.telemetry.snapshot import FleetSnapshot
from tests.support.autoscaler_fakes import TICK, FakeFleet, play, scaler

pytestmark = pytest.mark.unit


def test_a_spike_scales_up_within_the_short_window() -> None:
    fleet = FakeFleet(VirtualClock())
    auto = scaler(fleet)
    assert play(auto, fleet, 20, queued=2, slot_util=0.5) == []
    spike_at = fleet.clock.now()
    taken = play(auto, fleet, 10, queued=38)
    assert len(taken) == 1
    when, decision = taken[0]
    assert spike_at + 5 <= when <= spike_at + 5 + 2 * TICK
    assert decision.delta == 3  # 38 queued at 10 a replica wants 4: three more
    event = fleet.events.recent("scale")[-1]
    assert event["message"].startswith("queue depth 38 > 10 for 5 s: +3") and event["delta"] == 3


def test_an_unservable_fleet_is_not_ordered_replicas() -> None:
    """Below min_replicas and under pressure, but no replica can load here: nothing is ordered."""
    fleet = FakeFleet(VirtualClock(), ready=0)
    fleet.unservable = "model: the weights file is missing"
    auto = scaler(fleet)
    assert play(auto, fleet, 20, queued=38) == []
    fleet.unservable = None  # a new configuration: the floor is restored at once
    (_, decision), *_ = play(auto, fleet, 1, queued=38)
    assert decision.delta >= 1


def test_the_reason_counts_replicas_already_starting() -> None:
    fleet = FakeFleet(VirtualClock(), ready=2, starting=1)
    auto = scaler(fleet)
    (_, decision), *rest = play(auto, fleet, 6, queued=38)
    assert decision == Decision(1, "queue depth 38 > 20 for 5 s: +1, 1 already starting")
    assert rest == []


def test_no_over_ordering_while_replicas_are_pending() -> None:
    fleet = FakeFleet(VirtualClock())
    auto = scaler(fleet)
    taken = play(auto, fleet, 60, queued=25)  # provisioning takes a minute: the queue stays
    assert [d.delta for _, d in taken] == [2, 0]  # one order, then one hold that says why
    assert "holding, 2 already starting" in taken[1][1].reason
    assert fleet.starting == 2
    fleet.become_ready()
    fleet.queued = 5  # the new replicas answer the queue
    assert play(auto, fleet, 60) == []


def test_slot_and_kv_pressure_scale_up_too() -> None:
    fleet = FakeFleet(VirtualClock())
    auto = scaler(fleet)
    taken = play(auto, fleet, 6, slot_util=1.0)
    assert [d.delta for _, d in taken] == [1] and "batch slots 100% >= 90%" in taken[0][1].reason
    fleet.become_ready()
    taken = play(auto, fleet, 6, slot_util=0.5, kv_util=0.95)
    assert [d.delta for _, d in taken] == [1] and "KV 95% >= 90%" in taken[0][1].reason


def test_a_dip_scales_down_only_after_the_long_window() -> None:
    fleet = FakeFleet(VirtualClock(), ready=3)
    auto = scaler(fleet)
    assert play(auto, fleet, 10, queued=4, slot_util=0.7) == []
    dip_at = fleet.clock.now()
    taken = play(auto, fleet, 29, queued=0, slot_util=0.1, kv_util=0.1)
    assert taken == []
    taken = play(auto, fleet, 2)
    assert [d.delta for _, d in taken] == [-1]
    assert taken[0][0] >= dip_at + 30 and "for 30 s: -1" in taken[0][1].reason
    assert (fleet.ready, fleet.draining) == (2, 1)
    assert play(auto, fleet, 40) == []  # one drain at a time
    fleet.draining = 0
    taken = play(auto, fleet, 31)
    assert [d.delta for _, d in taken] == [-1] and fleet.ready == 1
    assert play(auto, fleet, 120) == []  # never below min_replicas


def test_flapping_signals_do_not_flap_the_fleet() -> None:
    fleet = FakeFleet(VirtualClock(), ready=2)
    auto = scaler(fleet)
    taken = []
    for _ in range(30):  # two minutes of load that comes and goes every 2 s
        taken += play(auto, fleet, 2, queued=50, slot_util=1.0)
        taken += play(auto, fleet, 2, queued=0, slot_util=0.0)
    assert taken == []


def test_a_scale_up_restarts_the_down_window() -> None:
    fleet = FakeFleet(VirtualClock())
    auto = scaler(fleet, max_replicas=2)
    assert [d.delta for _, d in play(auto, fleet, 6, queued=30)] == [1]
    assert play(auto, fleet, 20, queued=0) == []  # calm while the new one starts: it is not undone
    fleet.become_ready()
    assert play(auto, fleet, 29) == []
    assert [d.delta for _, d in play(auto, fleet, 2)] == [-1]


def test_bounds_and_levers_apply_live() -> None:
    fleet = FakeFleet(VirtualClock())
    auto = scaler(fleet, warm_pool=1, provision_delay_s=7.0)
    assert (fleet.warm_pool, fleet.provision_delay_s) == (1, 7.0)
    auto.reconfigure(min_replicas=3, warm_pool=2, provision_delay_s=0.0)
    assert (fleet.warm_pool, fleet.provision_delay_s) == (2, 0.0)
    taken = play(auto, fleet, TICK)
    assert taken[0][1] == Decision(2, "1 ready + 0 starting < min_replicas 3: +2")
    fleet.become_ready()
    auto.reconfigure(min_replicas=1, max_replicas=2)
    taken = play(auto, fleet, 2 * TICK)
    assert [d.delta for _, d in taken] == [-1] and "> max_replicas 2" in taken[0][1].reason
    taken = play(auto, fleet, 10, queued=100)
    assert [d.delta for _, d in taken] == [0] and "holding, at max_replicas 2" in taken[0][1].reason


def test_config_from_levers_and_status() -> None:
    levers = {"min_replicas": 2, "max_replicas": 5, "warm_pool": 1, "provision_delay_s": 9.0, "queue_cap": 64}
    config = AutoscalerConfig.from_levers(levers, up_window_s=2.0)
    assert (config.min_replicas, config.max_replicas, config.warm_pool, config.provision_delay_s) == (2, 5, 1, 9.0)
    fleet = FakeFleet(VirtualClock(), ready=2)
    auto = Autoscaler(fleet, config, clock=fleet.clock)
    play(auto, fleet, 1.5, queued=30)
    status = auto.status()
    assert status["pressure_for_s"] == 1.0 and status["calm_for_s"] is None and not status["running"]
    play(auto, fleet, 1.0)
    assert auto.status()["last_decision"].startswith("queue depth 30 > 16 for 2 s: +2")


def test_signals_from_a_fleet_snapshot() -> None:
    snap = FleetSnapshot(
        time=3.0, queue_depth=7, waiting=2, batch_size=6, max_num_seqs=8, kv_used_blocks=10, kv_total_blocks=40,
        replicas={"ready": 2, "starting": 1, "provisioning": 1, "warm": 1, "draining": 1},
    )
    assert Signals.from_snapshot(snap) == Signals(3.0, 9, 0.75, 0.25, ready=2, starting=2, draining=1)
