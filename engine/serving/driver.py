"""Who runs the serving stack's steps. Router dispatch, fleet watching, snapshots and autoscaler
ticks are plain methods that do one round of work at the clock's now(); a Driver calls them at
their cadence. Live, WallClockDriver runs each on its own daemon thread (what the old per-class
loops did); in simulation the EventLoop (engine/sim/loop.py) is the driver, on virtual time."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("servelab.driver")

Step = Callable[[], bool]  # one round of work; False: do not run me again


class Driver(Protocol):
    def every(self, period_s: float, step: Step, wake: threading.Event | None = None) -> None:
        """Run step now and then every period_s while it returns True; `wake` set runs it early."""
        ...

    def after(self, delay_s: float, step: Callable[[], None]) -> None:
        """Run step once, delay_s from now."""
        ...


class WallClockDriver:
    """Live: each step on its own daemon thread, started every `period_s` of wall time (a fixed
    rate: the snapshot stream promises a count per second), until stop()."""

    def __init__(self, name: str = "driver", nice: int = 0) -> None:
        """nice: the CPU priority its threads take as they start (Linux nice is per thread; never
        raised above what they inherit): work that must yield to the live engine runs at 19."""
        self.name = name
        self.nice = nice
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pauses: list[threading.Event] = []

    def every(self, period_s: float, step: Step, wake: threading.Event | None = None) -> None:
        thread = threading.Thread(target=self._run, args=(period_s, step, wake), name=self.name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def after(self, delay_s: float, step: Callable[[], None]) -> None:
        timer = threading.Timer(delay_s, self._once, args=(step,))
        timer.daemon = True
        timer.name = f"{self.name}-after"
        timer.start()

    def _once(self, step: Callable[[], None]) -> None:
        if self._stop.is_set():
            return
        lower_this_threads_priority(self.nice)
        try:
            step()
        except Exception:
            log.exception("%s: a step failed", self.name)

    def _run(self, period_s: float, step: Step, wake: threading.Event | None) -> None:
        lower_this_threads_priority(self.nice)
        pause = wake if wake is not None else threading.Event()
        self._pauses.append(pause)
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                if not step():
                    return
            except Exception:  # one bad round must not end the step for good
                log.exception("%s: a step failed", self.name)
            now = time.monotonic()
            due = max(due + period_s, now)  # a slow round is not made up with a burst
            pause.wait(due - now)
            pause.clear()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask every thread to end after its current round, and wait for them (not from one of them)."""
        self._stop.set()
        for pause in self._pauses:
            pause.set()
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current and thread.is_alive():
                thread.join(timeout)

    @property
    def running(self) -> bool:
        return not self._stop.is_set() and any(t.is_alive() for t in self._threads)


def lower_this_threads_priority(nice: int) -> None:
    """Set the calling thread's nice to `nice` where that lowers its priority (Linux only: macOS's
    setpriority takes a process id, so a thread id could renice another process); a refusal
    leaves it as it was."""
    if nice <= 0 or sys.platform != "linux":
        return
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError:  # not permitted: run at the priority inherited
        pass
