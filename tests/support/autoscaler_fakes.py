"""A fake fleet for the autoscaler's tests (tests/test_autoscaler.py, test_autoscaler_ttft.py,
test_defences_fleet.py): scale_up turns into replicas "starting", scale_down into one "draining",
on a virtual clock, so a test sees exactly what the autoscaler ordered and when."""

from __future__ import annotations

from typing import Any

from engine.clock import VirtualClock
from engine.serving.routing.defences import Defences
from engine.serving.scaling.autoscaler import Autoscaler, AutoscalerConfig, Decision
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.snapshot import FleetSnapshot

TICK = 0.5


class FakeFleet:
    def __init__(self, clock: VirtualClock, ready: int = 1, starting: int = 0) -> None:
        self.clock = clock
        self.events = EventLog(clock)
        self.defences = Defences()
        self.ready, self.starting, self.draining = ready, starting, 0
        self.queued, self.slot_util, self.kv_util = 0, 0.0, 0.0
        self.warm_pool: int | None = None
        self.provision_delay_s: float | None = None
        self.unservable: str | None = None

    def snapshot(self) -> FleetSnapshot:
        slots = 100 * max(1, self.ready)
        states = {"ready": self.ready, "starting": self.starting, "draining": self.draining, "stopped": 3}
        return FleetSnapshot(
            time=self.clock.now(),
            queue_depth=self.queued,
            batch_size=round(self.slot_util * slots),
            max_num_seqs=slots,
            kv_used_blocks=round(self.kv_util * slots),
            kv_total_blocks=slots,
            replicas={k: v for k, v in states.items() if v},
        )

    def scale_up(self, count: int = 1) -> str:
        self.starting += count
        return f"{count} ordered"

    def scale_down(self) -> str:
        self.ready -= 1
        self.draining += 1
        return "draining one"

    def set_warm_pool(self, count: int) -> None:
        self.warm_pool = count

    def set_provision_delay(self, seconds: float) -> None:
        self.provision_delay_s = seconds

    def become_ready(self) -> None:
        self.ready, self.starting = self.ready + self.starting, 0


def scaler(fleet: FakeFleet, **config: Any) -> Autoscaler:
    settings = {"min_replicas": 1, "max_replicas": 4, "up_window_s": 5.0, "down_window_s": 30.0, "queue_high": 10}
    return Autoscaler(fleet, AutoscalerConfig(**(settings | config)), clock=fleet.clock)


def play(auto: Autoscaler, fleet: FakeFleet, seconds: float, **signals: Any) -> list[tuple[float, Decision]]:
    """Hold these signals for `seconds`, ticking every TICK; the decisions taken, with their times."""
    for key, value in signals.items():
        setattr(fleet, key, value)
    taken = []
    for _ in range(round(seconds / TICK)):
        fleet.clock.advance(TICK)
        decision = auto.tick()
        if decision is not None:
            taken.append((fleet.clock.now(), decision))
    return taken
