"""What the lab's clients measured at their end of the stream, over the same sliding window as the
server's figures: the user's view, drawn beside the server's on the ttft chart.

A client's TTFT runs from the moment it sent the request to the moment the first token reached it,
so it holds every wait the request met (the central queue, the replica, the stream's hops). With
honest server telemetry the two nearly coincide; a buffering proxy or a server that starts its
clock late pulls them apart, and that gap is the lesson."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

from engine.serving.load.loadgen import now as client_now
from engine.serving.load.loadgen_metrics import RequestRecord, RequestStatus
from engine.serving.telemetry.metrics import WINDOW_S, window_percentile


@dataclass(frozen=True)
class ClientView:
    """Client-measured latencies in seconds (None before any request got that far)."""

    ttft_p50: float | None = None
    ttft_p99: float | None = None
    itl_p50: float | None = None
    itl_p99: float | None = None
    e2el_p50: float | None = None
    e2el_p99: float | None = None
    completed: int = 0  # requests whose last token arrived within the window

    def fields(self) -> dict[str, float | int | None]:
        """The snapshot's `client_*` keys."""
        return {f"client_{key}": value for key, value in self.__dict__.items()}


class ClientLatency:
    """Tracks the records of requests in flight and recently ended; view() reads them. A TTFT
    counts when its first token arrived (as the server counts its own), ITL and e2e when the
    request ended."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = client_now) -> None:
        self.window_s = window_s
        self.clock = clock  # the clock the records' times were read from
        self._records: deque[RequestRecord] = deque()
        self._lock = threading.Lock()

    def track(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)

    def recent(self, since: float | None = None) -> list[RequestRecord]:
        """The records still tracked (in flight, or ended within the window), sent at or after
        `since` when given (the clients' clock)."""
        with self._lock:
            records = list(self._records)
        return [r for r in records if since is None or (r.send_time is not None and r.send_time >= since)]

    def view(self) -> ClientView:
        now = self.clock()
        since = now - self.window_s
        ttfts, itls, e2els = [], [], []
        with self._lock:
            while self._records and _ended_before(self._records[0], since):
                self._records.popleft()
            records = list(self._records)
        for record in records:
            times = list(record.token_times)
            if record.send_time is not None and times and times[0] >= since:
                ttfts.append(times[0] - record.send_time)
            if record.status == RequestStatus.OK and record.end_time is not None and record.end_time >= since:
                e2els.append(record.end_time - record.send_time)  # type: ignore[operator]
                itls += [b - a for a, b in pairwise(times)]
        ttfts.sort()
        itls.sort()
        e2els.sort()
        return ClientView(
            window_percentile(ttfts, 50),
            window_percentile(ttfts, 99),
            window_percentile(itls, 50),
            window_percentile(itls, 99),
            window_percentile(e2els, 50),
            window_percentile(e2els, 99),
            len(e2els),
        )


def _ended_before(record: RequestRecord, since: float) -> bool:
    """Done with: ended (any way) before the window, or never got a token and was sent before it."""
    if record.status == RequestStatus.PENDING:
        return False
    last = record.token_times[-1] if record.token_times else record.send_time
    return last is None or last < since
