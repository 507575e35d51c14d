"""The discrete-event loop: a heap of (time, step) on a VirtualClock. Each step is a plain
callable; running one may schedule others. Ties run in the order they were scheduled."""

from __future__ import annotations

import gc
import heapq
import itertools
import threading
from collections.abc import Callable

from engine.clock import VirtualClock


class EventLoop:
    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self.num_events = 0

    def at(self, when: float, step: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (max(when, self.clock.now()), next(self._order), step))

    def after(self, delay_s: float, step: Callable[[], None]) -> None:
        self.at(self.clock.now() + delay_s, step)

    def every(self, period_s: float, step: Callable[[], bool], wake: threading.Event | None = None) -> None:
        """Run step now and then every period_s for as long as it returns True (the Driver of
        engine/serving/driver.py). `wake` is not watched: in virtual time whoever would set it
        runs the step itself."""

        def tick() -> None:
            if step():
                self.after(period_s, tick)

        self.at(self.clock.now(), tick)

    def pending_before(self, when: float) -> bool:
        """An event is scheduled at or before `when`."""
        return bool(self._heap) and self._heap[0][0] <= when

    def run(self, until: float | None = None, done: Callable[[], bool] | None = None) -> None:
        """Run events in time order until none is left, the next is past `until`, or done().

        Python's cyclic garbage collector is paused meanwhile (reference counting still frees
        everything the simulation drops): a big run holds millions of objects (every queued
        request's prompt), and each full collection walked them all, a tenth of the wall time."""
        paused = gc.isenabled()
        gc.disable()
        try:
            self._run(until, done)
        finally:
            if paused:
                gc.enable()

    def _run(self, until: float | None, done: Callable[[], bool] | None) -> None:
        heap, clock = self._heap, self.clock
        while heap:
            when = heap[0][0]
            if (until is not None and when > until) or (done is not None and done()):
                break
            _, _, step = heapq.heappop(heap)
            clock.advance(when - clock.now())
            self.num_events += 1
            step()
