"""Closed-loop clients (`SimSpec.concurrency`), as `vllm bench serve --max-concurrency N` runs
them: N clients, each sending its next request the moment its previous one ends (finished,
refused or failed), no think time. A request is due at its workload arrival (all at 0 with
--rate inf, a benchmark's N users; rate-limited arrivals otherwise, as vLLM's) and is sent then,
or, while N requests are in flight, when one ends, first due first sent. Its latency starts when
it is sent, as vLLM's client clocks it.

The run (engine/sim/run.py, fleet_run.py) tells the clients every end it sees itself (a finish,
a refusal at submit); the answers a request gets on its stream (a RequestError: its deadline, a
failed replica, no replica left) reach them through the stream `answers()` gives it."""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable
from typing import Any

from engine.serving.replicas.messages import RequestError
from engine.sim.loop import EventLoop
from engine.sim.workload import SimRequest


class Answers(queue.Queue):
    """A request's event stream that tells its client at once when it ends in an error."""

    def __init__(self, on_error: Callable[[], None]) -> None:
        super().__init__()
        self._on_error = on_error

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        if isinstance(item, RequestError):
            self._on_error()


class ClosedLoop:
    def __init__(
        self, concurrency: int, loop: EventLoop, hop_s: float, arrivals: dict[str, float],
        send: Callable[[SimRequest], None],
    ) -> None:
        """hop_s: client -> router; arrivals: each request's send time is written here (the
        Recorder's, from which its TTFT and e2e latency count); send(r): r reaches the router."""
        self.concurrency = concurrency
        self.loop = loop
        self.hop_s = hop_s
        self.arrivals = arrivals
        self.send = send
        self.in_flight = 0
        self.in_flight_max = 0  # the most requests sent and not yet ended at once (<= concurrency)
        self.last_sent_s = 0.0
        self._waiting: deque[SimRequest] = deque()  # due, waiting for a client
        self._open: set[str] = set()

    def start(self, requests: list[SimRequest]) -> None:
        for r in requests:
            self.loop.at(r.arrival, lambda r=r: self._due(r))

    def _due(self, r: SimRequest) -> None:
        if self.in_flight < self.concurrency:
            self._go(r)
        else:
            self._waiting.append(r)

    def _go(self, r: SimRequest) -> None:
        now = self.loop.clock.now()
        self.in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self.in_flight)
        self._open.add(r.request_id)
        self.arrivals[r.request_id] = self.last_sent_s = now
        self.loop.at(now + self.hop_s, lambda: self.send(r))

    def ended(self, request_id: str) -> None:
        """The request is over (once: a second word of the same end is ignored); its client
        sends the next due request now."""
        if request_id not in self._open:
            return
        self._open.discard(request_id)
        self.in_flight -= 1
        if self._waiting:
            self._go(self._waiting.popleft())

    def answers(self, request_id: str) -> Answers:
        return Answers(lambda: self.ended(request_id))

    def figures(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "in_flight_max": self.in_flight_max, "last_sent_s": self.last_sent_s}
