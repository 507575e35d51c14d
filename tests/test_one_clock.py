"""One clock and one ticker (issue 27): the load generator waits out its offsets on the clock it
is given, and the lab's traffic books its arrivals on a driver, so a VirtualClock and the
what-if EventLoop run both with no wall time passing."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from engine.clock import VirtualClock
from engine.lab.arrivals import LONG_GAP_S
from engine.lab.traffic import TrafficDriver
from engine.serving.load.loadgen import LoadRequest, RequestRecord, make_requests, run_load
from engine.sim.loop import EventLoop

pytestmark = pytest.mark.unit


class Recorder:
    """A Target that ends every request at once and remembers which it saw."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self._lock = threading.Lock()

    def send(self, request: LoadRequest, record: RequestRecord, stop: threading.Event) -> None:
        with self._lock:
            self.sent.append(request.request_id)
        record.start(0.0)
        record.token(0.0)
        record.done()


def test_run_load_waits_out_its_offsets_on_the_given_clock() -> None:
    clock, target = VirtualClock(100.0), Recorder()
    records = run_load(target, make_requests(3, 4, 4), [0.0, 1.5, 4.0], max_duration_s=10.0, clock=clock)
    assert clock.now() == 104.0  # virtual seconds, passed at once
    assert len(target.sent) == 3 and all(r.status == "ok" for r in records)


def test_run_load_stops_at_max_duration_on_the_given_clock() -> None:
    clock, target = VirtualClock(), Recorder()
    records = run_load(target, make_requests(2, 4, 4), [0.0, 20.0], max_duration_s=10.0, clock=clock)
    assert clock.now() == 10.0
    assert len(target.sent) == 1 and records[1].status == "failed"


def traffic_on(loop: EventLoop, levers: dict[str, Any]) -> TrafficDriver:
    # No server: each arrival fails at once on its client thread, but is counted as sent.
    return TrafficDriver(None, lambda: levers, clock=loop.clock, driver=loop)


def levers_at(rate: float) -> dict[str, Any]:
    return {"request_rate": rate, "burstiness": float("inf"), "prompt_tokens": 4, "output_tokens": 4}


def test_the_traffic_books_its_arrivals_on_the_driver_and_stops() -> None:
    loop = EventLoop()
    traffic = traffic_on(loop, levers_at(2.0))  # evenly spaced: one arrival every 0.5 s
    traffic.start()
    assert traffic.running and traffic.sent == 0  # the first arrival is a gap away
    loop.run(until=10.0)
    assert traffic.sent == 20
    traffic.stop()
    loop.run(until=20.0)
    assert traffic.sent == 20 and not traffic.running  # the booked arrival did nothing


def test_rate_zero_and_long_gaps_look_at_the_levers_again() -> None:
    loop = EventLoop()
    levers = levers_at(0.0)
    traffic = traffic_on(loop, levers)
    traffic.start()  # rate 0: a look at the levers every 0.2 s (0.2, 0.4, ...)
    loop.run(until=3.1)
    assert traffic.running and traffic.sent == 0
    levers["request_rate"] = 1 / (2 * LONG_GAP_S)  # the look at 3.2 draws a 10 s gap: drawn again at 8.2
    loop.run(until=3.2 + LONG_GAP_S - 0.1)
    assert traffic.sent == 0
    levers["request_rate"] = 2.0  # the look at 8.2 draws a 0.5 s gap, not the 10 s one waited out
    loop.run(until=3.2 + LONG_GAP_S + 0.4)
    assert traffic.sent == 0
    loop.run(until=3.2 + LONG_GAP_S + 0.6)
    assert traffic.sent == 1


def test_a_step_that_raises_ends_the_traffic_and_says_so() -> None:
    loop = EventLoop()
    levers = levers_at(2.0)
    traffic = traffic_on(loop, levers)
    traffic.start()
    del levers["burstiness"]
    with pytest.raises(KeyError):
        loop.run(until=1.0)
    assert not traffic.running
