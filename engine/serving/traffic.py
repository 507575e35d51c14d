"""Live traffic for the lab: an open-ended load generator whose rate, lengths and burstiness
follow the levers while it runs, with an optional linear ramp (the "flood").

Each arrival draws its gap from the same gamma distribution as the benchmark load generator
(Poisson at burstiness 1): next_gap() and next_request() are the steps, read at the clock's
now(); live, a thread waits out each gap and every request runs on its own thread through
RouterTarget (a client holding its stream), so flood requests wait in the same central queue
as every HTTP request. The driver is the lab's client: it times
each request at its own end of the stream (`clients`), the user's view beside the server's."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.clock import WALL_CLOCK, Clock
from engine.serving.client_stats import ClientLatency
from engine.serving.loadgen import VOCAB, LoadRequest, RouterTarget, draw_length
from engine.serving.loadgen_metrics import RequestRecord
from engine.serving.router import Router

MAX_IN_FLIGHT = 512  # client threads: past this the generator waits, so the web process stays light


@dataclass
class Ramp:
    start_rate: float
    end_rate: float
    start_time: float
    duration_s: float

    def rate(self, now: float) -> float:
        done = min(1.0, max(0.0, (now - self.start_time) / self.duration_s)) if self.duration_s > 0 else 1.0
        return self.start_rate + (self.end_rate - self.start_rate) * done


class TrafficDriver:
    """`levers()` returns the current request_rate, prompt_tokens, output_tokens, burstiness."""

    def __init__(
        self,
        router: Router,
        levers: Callable[[], dict[str, Any]],
        api_key: str | None = None,
        clock: Clock = WALL_CLOCK,
        seed: int = 0,
    ) -> None:
        self._target = RouterTarget(router, api_key)
        self._levers = levers
        self.clock = clock
        self.rng = random.Random(seed)
        self.ramp: Ramp | None = None
        self.sent = 0
        self.refused = 0
        self.clients = ClientLatency()
        self._in_flight = threading.Semaphore(MAX_IN_FLIGHT)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._run_id = uuid.uuid4().hex[:6]

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def current_rate(self) -> float:
        if self.ramp is not None:
            return self.ramp.rate(self.clock.now())
        return float(self._levers()["request_rate"])

    def start(self, ramp_to: float | None = None, ramp_s: float = 30.0) -> None:
        """Start sending (or, if running, just set the ramp); ramp_to None holds the lever's rate."""
        now = self.clock.now()
        base = float(self._levers()["request_rate"])
        self.ramp = None if ramp_to is None else Ramp(base, ramp_to, now, ramp_s)
        if self.running:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(self._stop,), name="traffic", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sending; requests in flight finish normally (none is cut)."""
        self._stop.set()
        self.ramp = None

    def next_gap(self) -> float | None:
        """Seconds from the last arrival to the next at the current rate; None: the rate is 0."""
        rate = self.current_rate()
        if rate <= 0:
            return None
        burst = float(self._levers()["burstiness"])
        return self.rng.gammavariate(burst, 1.0 / (rate * burst))

    def next_request(self) -> LoadRequest:
        """The next arrival's request, its lengths drawn around the levers' means of this moment."""
        levers = self._levers()
        n_in = draw_length(self.rng, int(levers["prompt_tokens"]), 0.5)
        n_out = draw_length(self.rng, int(levers["output_tokens"]), 0.5)
        request = LoadRequest(
            f"flood-{self._run_id}-{self.sent}", [self.rng.randrange(*VOCAB) for _ in range(n_in)], n_out
        )
        self.sent += 1
        return request

    def _loop(self, stop: threading.Event) -> None:
        """Live: wait out each gap on the wall clock, then send on a client thread."""
        while not stop.is_set():
            gap = self.next_gap()
            if gap is None:
                stop.wait(0.2)
                continue
            if stop.wait(min(gap, 5.0)) or gap > 5.0:  # a long gap re-reads the levers first
                continue
            if not self._in_flight.acquire(timeout=1.0):
                continue
            threading.Thread(target=self._send, args=(self.next_request(),), daemon=True).start()

    def _send(self, request: LoadRequest) -> None:
        record = RequestRecord(0, request.request_id, len(request.prompt_token_ids), request.max_tokens)
        self.clients.track(record)
        try:
            # Flood requests are never cut when the flood stops: the stop event stays clear.
            self._target.send(request, record, threading.Event())
            self.refused += record.status == "rejected"
        finally:
            self._in_flight.release()
