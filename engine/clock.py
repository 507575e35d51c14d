"""One clock for the whole serving stack. The live engine reads wall time; the what-if simulator
hands the same code a VirtualClock that it advances itself."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class SleepingClock(Clock, Protocol):
    """A clock a caller may also wait on (a load generator pacing its arrivals). Apart from
    Clock: most readers only read now(), and a fake clock need not know how to wait."""

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class VirtualClock:
    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def sleep(self, seconds: float) -> None:
        """Virtual time passes at once. For a lone caller that paces itself; under an EventLoop
        the loop advances the clock and a step never sleeps."""
        self.advance(seconds)


WALL_CLOCK = WallClock()


def stopwatch() -> Callable[[], float]:
    """Wall seconds since the call: how long a simulation took to run (never simulated time)."""
    start = time.perf_counter()
    return lambda: time.perf_counter() - start
