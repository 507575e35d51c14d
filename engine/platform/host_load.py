"""What else the machine did while a measurement ran, and whether the measurement is kept (issue 40).

A calibration or a figure is a timing, and a timing taken beside other work describes that
contention, not the machine: a first-start fit at load average 4.1 on 2 cores put the simulator
at 0.72 of the live engine, against 1.09 when fitted on the quiet machine. So a measurement runs
inside `ConditionMeter` windows, which record the CPU time everything else on the machine used
(/proc/stat's busy time less this process tree's own), the hypervisor's steal, and whether the
process was paused meanwhile (engine/launch/yielding.py stops it with SIGSTOP while the live
engine serves; the SIGCONT that resumes it is counted here). `Conditions.refusal()` says why a
measurement is not kept, against the bounds below, or None.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

# Bounds a kept measurement ran within. Others' CPU: the live server idling with a page open
# uses a few hundredths of a core (BENCHMARKS, thirty watchers: 0.04), a second busy process a
# whole one, which slows a 2-thread step 5-20x. Spread: the relative range of one step's
# repeated timings (median over the steps; the first run's cold caches included): 18% and 29%
# in two calibrations on a quiet 2-core Xeon VM (BENCHMARKS.md, issue 40), where a neighbour's
# 5-20x shows as several hundred percent.
MAX_OTHERS_CORES = 0.25
MAX_STEAL = 0.05
MAX_SPREAD = 0.50
MAX_FIT_ERROR = 0.10  # a fit's median step error (bench/calibrate.py)

_pauses = 0


def _on_continue(signum: int, frame: object) -> None:
    global _pauses
    _pauses += 1


def count_pauses() -> None:
    """Count each SIGCONT this process receives: each one ends a pause (a SIGSTOP cannot be
    caught, its SIGCONT can). Call once, from the main thread."""
    if hasattr(signal, "SIGCONT"):
        signal.signal(signal.SIGCONT, _on_continue)


def pauses() -> int:
    return _pauses


@dataclass(frozen=True)
class CpuTimes:
    """One reading: the machine's busy and steal CPU seconds (all cores), this process tree's own
    CPU seconds, and the monotonic time it was taken."""

    busy: float
    steal: float
    own: float
    at: float


def read_times() -> CpuTimes | None:
    """/proc/stat's first line and this process's (and its reaped children's) CPU time; None
    where there is no /proc/stat (the measurement then records no conditions and is kept)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    own = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))  # fmt: skip
    return CpuTimes((user + nice + system + irq + softirq) / hz, steal / hz, own, time.monotonic())


@dataclass(frozen=True)
class Conditions:
    """What a measurement ran beside, over the windows it kept."""

    seconds: float  # the kept windows' wall time
    others_cores: float  # CPU the rest of the machine used meanwhile, in cores
    steal_fraction: float  # of the machine's CPU time, taken by the hypervisor
    load_average: float  # the 1-minute load average at the end (this measurement's threads included)
    pauses: int  # times the live engine paused it (each interrupted window was dropped)
    spread: float | None  # median relative range of repeated timings, where it repeats any

    def refusal(self, fit_error: float | None = None) -> str | None:
        """Why this measurement is not kept, or None: the first bound it broke."""
        if self.pauses and self.seconds == 0:
            return f"the live engine paused it in every window ({self.pauses})"
        if self.others_cores > MAX_OTHERS_CORES:
            return f"other work used {self.others_cores:.2f} cores meanwhile (at most {MAX_OTHERS_CORES})"
        if self.steal_fraction > MAX_STEAL:
            return f"the hypervisor took {self.steal_fraction:.0%} of the CPU (at most {MAX_STEAL:.0%})"
        if self.spread is not None and self.spread > MAX_SPREAD:
            return f"repeated timings spread by {self.spread:.0%} (at most {MAX_SPREAD:.0%})"
        if fit_error is not None and fit_error > MAX_FIT_ERROR:
            return f"the fit's median step error is {fit_error:.1%} (at most {MAX_FIT_ERROR:.0%})"
        return None

    def to_json(self) -> dict[str, object]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


class ConditionMeter:
    """Accumulates the conditions over the windows a measurement keeps: `with meter.window() as
    kept:` times one unit of work; `kept()` afterwards is False when a pause fell inside it, and
    then the window does not count (the caller drops or repeats that unit)."""

    def __init__(self, reader: Callable[[], CpuTimes | None] = read_times, cores: int | None = None) -> None:
        self.reader = reader
        self.cores = cores or os.cpu_count() or 1
        self.seconds = self.others = self.steal = 0.0
        self.interrupted = 0
        self.spreads: list[float] = []

    @contextlib.contextmanager
    def window(self) -> Iterator[Callable[[], bool]]:
        before, paused = self.reader(), pauses()
        result = {"kept": True}
        yield lambda: result["kept"]
        after = self.reader()
        if pauses() != paused:
            self.interrupted += 1
            result["kept"] = False
            return
        if before is None or after is None:
            return
        span = after.at - before.at
        self.seconds += span
        self.others += max(0.0, (after.busy - before.busy) - (after.own - before.own))
        self.steal += max(0.0, after.steal - before.steal)

    def repeated(self, timings: list[float]) -> None:
        """One unit's repeated timings: their relative range joins the spread."""
        if len(timings) >= 2 and min(timings) > 0:
            self.spreads.append((max(timings) - min(timings)) / statistics.median(timings))

    def conditions(self) -> Conditions:
        capacity = max(self.seconds * self.cores, 1e-9)
        return Conditions(
            seconds=self.seconds,
            others_cores=self.others / max(self.seconds, 1e-9) if self.seconds else 0.0,
            steal_fraction=self.steal / capacity if self.seconds else 0.0,
            load_average=os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0,
            pauses=self.interrupted,
            spread=statistics.median(self.spreads) if self.spreads else None,
        )
