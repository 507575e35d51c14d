"""The lab's one arrival loop, live and simulated alike: arrivals at the levers' request_rate (or a
flood's ramp), each gap drawn from the benchmark load generator's gamma distribution (Poisson at
burstiness 1), booked on a Driver and read at its clock's now(). Live, the Driver is a
WallClockDriver and an arrival sends a request over HTTP (engine/lab/traffic.py); simulated, it is
the lab's EventLoop and an arrival submits to the simulated fleet (engine/lab/simulated/lab_sim.py).
Only what an arrival does differs; when it comes is decided here, once."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.clock import Clock
from engine.serving.driver import Driver
from engine.serving.load.loadgen import arrival_gap

RATE_ZERO_LOOK_S = 0.2  # at rate 0, how often the levers are read again
LONG_GAP_S = 5.0  # a longer gap is not waited out: the levers are read again first (a raised rate applies)


@dataclass
class Ramp:
    start_rate: float
    end_rate: float
    start_time: float
    duration_s: float

    def rate(self, now: float) -> float:
        done = min(1.0, max(0.0, (now - self.start_time) / self.duration_s)) if self.duration_s > 0 else 1.0
        return self.start_rate + (self.end_rate - self.start_rate) * done


def ramp_after(ramp: Ramp | None, changed: Mapping[str, Any]) -> Ramp | None:
    """A learner who moves request_rate during a flood's ramp sets the rate: the ramp ends and the
    lever's rate holds from then on."""
    return None if "request_rate" in changed else ramp


class Arrivals:
    """Books `arrive` on `driver` at the rate of each moment. `levers()` gives request_rate and
    burstiness; the gaps come from their own generator (seeded), so two labs with the same seed and
    the same lever script see their arrivals at the same times, whatever each arrival draws."""

    def __init__(
        self,
        levers: Callable[[], Mapping[str, Any]],
        clock: Clock,
        driver: Driver,
        arrive: Callable[[], None],
        seed: int = 0,
    ) -> None:
        self._levers = levers
        self.clock = clock
        self._driver = driver
        self._arrive_one = arrive
        self.rng = random.Random(f"arrivals-{seed}")  # apart from what each arrival draws
        self.ramp: Ramp | None = None
        self._run = 0  # the current run of arrivals; stop() and start() move it on
        self._sending = False

    @property
    def running(self) -> bool:
        return self._sending

    def current_rate(self) -> float:
        if self.ramp is not None:
            return self.ramp.rate(self.clock.now())
        return float(self._levers()["request_rate"])

    def start(self, ramp_to: float | None = None, ramp_s: float = 30.0) -> None:
        """Start arriving (or, if running, just set the ramp); ramp_to None holds the lever's rate.
        The first arrival is one gap away."""
        now = self.clock.now()
        base = float(self._levers()["request_rate"])
        self.ramp = None if ramp_to is None else Ramp(base, ramp_to, now, ramp_s)
        if self._sending:
            return
        self._run += 1
        self._sending = True
        self._book(self._run, now)

    def levers_moved(self, changed: Mapping[str, Any]) -> None:
        """The load levers just moved: a flood's ramp ends when request_rate does (ramp_after)."""
        self.ramp = ramp_after(self.ramp, changed)

    def stop(self) -> None:
        """No more arrivals (the one booked does nothing); what arrived goes on."""
        self._sending = False
        self._run += 1
        self.ramp = None

    def next_gap(self) -> float | None:
        """Seconds from the last arrival to the next at the current rate; None: the rate is 0."""
        rate = self.current_rate()
        if rate <= 0:
            return None
        return arrival_gap(self.rng, rate, float(self._levers()["burstiness"]))

    def _book(self, run: int, since: float) -> None:
        """Book run's next step: the next arrival one gap after `since` (the clock's time at the
        last one: what an arrival does and the booking do not lengthen the gap), or, at rate 0 or
        past a long gap, another look at the levers."""
        gap = self.next_gap()
        wait = RATE_ZERO_LOOK_S if gap is None else min(gap, LONG_GAP_S)
        delay_s = max(0.0, since + wait - self.clock.now())
        if gap is not None and gap <= LONG_GAP_S:
            self._after(run, delay_s, lambda: self._arrive(run))
        else:
            self._after(run, delay_s, lambda: self._book(run, self.clock.now()))

    def _arrive(self, run: int) -> None:
        since = self.clock.now()
        self._arrive_one()
        self._book(run, since)

    def _after(self, run: int, delay_s: float, step: Callable[[], None]) -> None:
        """Run step delay_s from now on the driver, if run is still the current one. A step that
        raises books nothing after it, so the arrivals have ended: running says so (the driver
        logs why)."""

        def booked() -> None:
            if run != self._run:
                return
            try:
                step()
            except Exception:
                if run == self._run:
                    self._sending = False
                raise

        self._driver.after(delay_s, booked)
