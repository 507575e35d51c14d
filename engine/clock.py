"""One clock for the whole serving stack. The live engine reads wall time; the what-if simulator
hands the same code a VirtualClock that it advances itself."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class WallClock:
    def now(self) -> float:
        return time.monotonic()


class VirtualClock:
    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


WALL_CLOCK = WallClock()


def stopwatch() -> Callable[[], float]:
    """Wall seconds since the call: how long a simulation took to run (never simulated time)."""
    start = time.perf_counter()
    return lambda: time.perf_counter() - start
