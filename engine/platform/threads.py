"""The engine's CPU threads, fitted to the cores it actually gets.

A step is hundreds of parallel regions (every linear, every attention call), each ending in a
barrier that waits for the slowest thread. When another process keeps one of two cores busy (the
learner's browser drawing the charts, a second replica, a test runner), one of the engine's two
threads is descheduled for a whole scheduler slice at a time and every barrier waits on it: a
step measured 3-4x slower beside one busy neighbour, where losing a core should cost at most 2x.

So the live runner asks, a few times a second, how busy the cores it may run on were with other
work (Linux /proc/stat, per core, less this process's own time), and runs with as many threads as
there are cores left: one thread beside one busy neighbour on two cores costs that core's share,
no more. A thread count the config fixes (num_threads) is the most it uses. Where /proc/stat is
not there (macOS) it keeps the count it was given.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from engine.platform import machine

CHECK_EVERY_S = 0.25  # how often the cores are read (two small /proc reads, about 50 us)
BUSY_TO_DROP = 0.6  # others' use of a core, in cores, that costs the engine a thread
BUSY_TO_RESTORE = 0.3  # hysteresis: a thread comes back once others use less than this


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


class CoreWatch:
    """Busy time of a set of cores, and this process's own, from /proc (None where absent)."""

    def __init__(self, cores: list[int]) -> None:
        self.cores = {f"cpu{c}" for c in cores}
        self.tick_s = 1.0 / _ticks()
        # Time of niced processes (the what-if worker, web/whatif_worker.py) is /proc/stat's
        # `nice` column: they yield the core to this one, so they take nothing from it. (A niced
        # engine's own time lands there too; then `nice` counts, so that `mine` can come off it.)
        self.count_nice = os.getpriority(os.PRIO_PROCESS, 0) > 0

    def read(self) -> tuple[float, float] | None:
        """(seconds the cores were busy, seconds this process ran), both since boot."""
        try:
            stat = Path("/proc/stat").read_text()
            own = Path("/proc/self/stat").read_text()
        except OSError:
            return None
        busy = 0
        for line in stat.splitlines():
            name, _, rest = line.partition(" ")
            if name in self.cores:
                # user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait
                values = [int(v) for v in rest.split()]
                busy += sum(values) - values[3] - (values[4] if len(values) > 4 else 0)
                busy -= 0 if self.count_nice else values[1]
        fields = own.rsplit(")", 1)[1].split()
        mine = int(fields[11]) + int(fields[12])  # utime + stime, every thread of this process
        return busy * self.tick_s, mine * self.tick_s


class ThreadGovernor:
    """Sets torch's thread count before a step: the cores others left, at most `most`."""

    def __init__(
        self,
        most: int,
        cores: list[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        set_threads: Callable[[int], None] = torch.set_num_threads,
    ) -> None:
        self.most = max(1, most)
        self.watch = CoreWatch(cores if cores is not None else machine.affinity())
        self.clock = clock
        self.set_threads = set_threads
        self.threads = self.most
        self.others_cores = 0.0  # what other work used of our cores over the last interval
        self.changes = 0
        self._last = self.watch.read()
        self._last_t = clock()

    @property
    def enabled(self) -> bool:
        return self._last is not None and self.most > 1

    def before_step(self) -> int:
        """The threads to run this step with (read the cores at most every CHECK_EVERY_S)."""
        now = self.clock()
        if not self.enabled or now - self._last_t < CHECK_EVERY_S:
            return self.threads
        reading = self.watch.read()
        if reading is None or self._last is None:
            return self.threads
        wall = now - self._last_t
        busy = reading[0] - self._last[0]
        mine = reading[1] - self._last[1]
        self._last, self._last_t = reading, now
        self.others_cores = max(0.0, busy - mine) / wall
        self.decide(self.others_cores)
        return self.threads

    def decide(self, others_cores: float) -> None:
        """Drop to the cores others leave once they hold BUSY_TO_DROP of one; grow back only once
        they hold less than BUSY_TO_RESTORE (so a neighbour at half a core does not flap it)."""
        room_to_drop = self.most - math.floor(others_cores + 1 - BUSY_TO_DROP)
        room_to_grow = self.most - math.floor(others_cores + 1 - BUSY_TO_RESTORE)
        want = self.threads
        if room_to_drop < self.threads:
            want = room_to_drop
        elif room_to_grow > self.threads:
            want = room_to_grow
        want = max(1, min(self.most, want))
        if want != self.threads:
            self.threads = want
            self.changes += 1
            self.set_threads(want)
