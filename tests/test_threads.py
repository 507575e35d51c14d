"""The thread governor (engine/platform/threads.py): threads follow the cores other processes leave, with
hysteresis; its /proc reading sees a real busy process on this machine's cores."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from engine.platform import machine
from engine.platform.threads import CoreWatch, ThreadGovernor

pytestmark = pytest.mark.integration


def governor(most: int) -> tuple[ThreadGovernor, list[int]]:
    calls: list[int] = []
    return ThreadGovernor(most, cores=list(range(most)), set_threads=calls.append), calls


@pytest.mark.parametrize(
    ("others", "threads"), [(0.0, 2), (0.2, 2), (0.59, 2), (0.6, 1), (1.0, 1), (1.9, 1)]
)
def test_two_cores_drop_a_thread_for_a_busy_neighbour(others: float, threads: int) -> None:
    g, calls = governor(2)
    g.decide(others)
    assert g.threads == threads
    assert calls == ([] if threads == 2 else [threads])


def test_it_grows_back_only_once_the_neighbour_lets_go() -> None:
    g, calls = governor(2)
    g.decide(1.0)
    for others in (0.5, 0.4, 0.31):  # a neighbour at part of a core: no flapping
        g.decide(others)
        assert g.threads == 1
    g.decide(0.1)
    assert g.threads == 2 and calls == [1, 2]


def test_more_cores_drop_as_many_threads_as_cores_taken() -> None:
    g, _ = governor(8)
    g.decide(2.7)
    assert g.threads == 5
    g.decide(2.4)  # within the hysteresis band: stays
    assert g.threads == 5
    g.decide(0.0)
    assert g.threads == 8


def test_one_thread_is_never_changed() -> None:
    g, calls = governor(1)
    g.decide(5.0)
    assert g.threads == 1 and not g.enabled and calls == []


@pytest.mark.skipif(not CoreWatch([0]).read(), reason="no /proc/stat here")
def test_the_reading_counts_this_process_within_its_cores() -> None:
    """Whatever else the machine is doing: the cores' busy time covers this process's own, which
    the reading sees grow by the CPU time spent between two readings."""
    watch = CoreWatch(machine.affinity())
    before = watch.read()
    start = time.process_time()
    while time.process_time() - start < 0.5:
        pass
    after = watch.read()
    assert before is not None and after is not None
    mine, busy = after[1] - before[1], after[0] - before[0]
    assert 0.4 <= mine <= busy + 0.05, (mine, busy)


def test_a_niced_busy_process_takes_no_core_from_the_reading() -> None:
    """The what-if worker runs niced (web/whatif_worker.py): its time is /proc/stat's `nice`
    column, which the reading leaves out, while a busy process at normal priority shows."""
    cores = machine.affinity()
    watch = CoreWatch(cores)

    def others_over(seconds: float, *prefix: str) -> float:
        hog = subprocess.Popen([*prefix, sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.5)  # started and spinning
            before, t0 = watch.read(), time.monotonic()
            time.sleep(seconds)
            after, t1 = watch.read(), time.monotonic()
        finally:
            hog.kill()
            hog.wait()
        assert before is not None and after is not None
        return ((after[0] - before[0]) - (after[1] - before[1])) / (t1 - t0)

    niced = others_over(1.0, "nice", "-n", "19")
    plain = others_over(1.0)
    assert plain >= 0.6, f"a spinning process showed {plain:.2f} of a core: expected >= 0.6 (most of one)"
    assert niced < plain - 0.5, f"niced {niced:.2f} of a core, plain {plain:.2f}: expected niced below plain - 0.5"
