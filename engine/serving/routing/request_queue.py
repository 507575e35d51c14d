"""The one central request queue in front of the fleet: bounded, with deadlines.

A full queue refuses with a Retry-After computed from the measured drain rate, with full
jitter, so refused clients do not come back as one wave (the defence `retry_jitter`: off, it is
the exact drain estimate, and clients refused together return together). A request's arrival time is stamped
here, once, at the moment it is admitted: it travels with the request to its replica, so TTFT,
queue time and e2e latency all include the wait in this queue. The deadline counts from it and
is checked again at dequeue, so a request whose client has given up never buys a prefill.

Two of the defences (engine/serving/routing/defences.py) live here, read at each decision: queue_bound
off, the cap is ignored and the queue becomes a delay line; deadline_recheck off, nothing is
dropped at its deadline (the replica then prefills it anyway)."""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from engine.clock import Clock
from engine.sampling_params import SamplingParams
from engine.serving.routing.defences import Defences
from engine.serving.routing.prefix_memory import PromptBlocks

DRAIN_WINDOW_S = 10.0  # dequeues counted over this window to estimate the drain rate


@dataclass
class QueuedRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: float = 0.0  # stamped by offer() on admission: the request's one arrival time
    deadline: float | None = None
    payload: Any = None  # what the caller needs to answer it (its stream)
    blocks: PromptBlocks | None = None  # the prompt's chained block keys, for routing
    priority: int = 0  # vLLM's request priority, lower sooner: the replica's scheduler orders by it


@dataclass
class Admission:
    admitted: bool
    reason: str | None = None  # "queue_full"
    retry_after_s: int | None = None


class RequestQueue:
    def __init__(
        self,
        cap: int,
        deadline_s: float | None,
        clock: Clock,
        rng: random.Random | None = None,
        defences: Defences | None = None,
    ) -> None:
        """defences: the fleet's (read at each decision: queue_bound, deadline_recheck,
        retry_jitter); None: all on."""
        if cap < 1:
            raise ValueError("queue_cap must be at least 1")
        self.cap = cap
        self.deadline_s = deadline_s
        self.clock = clock
        self.rng = rng or random.Random()
        self.defences = Defences() if defences is None else defences  # the fleet's: never copied
        self._items: deque[QueuedRequest] = deque()
        self._dequeued_at: deque[float] = deque()
        self._expired: list[QueuedRequest] = []
        self.num_admitted = 0
        self.num_rejected = 0
        self.num_expired = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, request_id: object) -> bool:
        return any(r.request_id == request_id for r in list(self._items))

    def offer(self, request: QueuedRequest) -> Admission:
        if self.defences.queue_bound and len(self._items) >= self.cap:
            self.num_rejected += 1
            return Admission(False, "queue_full", self.retry_after())
        now = self.clock.now()
        request.arrival = now
        request.deadline = None if self.deadline_s is None else now + self.deadline_s
        self._items.append(request)
        self.num_admitted += 1
        return Admission(True)

    def peek(self) -> QueuedRequest | None:
        """The oldest request still within its deadline (expired ones are set aside)."""
        self._expire()
        return self._items[0] if self._items else None

    def pop(self) -> QueuedRequest | None:
        request = self.peek()
        if request is not None:
            self._items.popleft()
            self._dequeued_at.append(self.clock.now())
        return request

    def remove(self, request_id: str) -> QueuedRequest | None:
        """Take out a request whose client went away before it was dispatched."""
        for request in self._items:
            if request.request_id == request_id:
                self._items.remove(request)
                return request
        return None

    def take_expired(self) -> list[QueuedRequest]:
        """Requests dropped at their deadline since the last call, for the caller to answer."""
        self._expire()
        expired, self._expired = self._expired, []
        return expired

    def drain_rate(self) -> float:
        """Dequeues per second over the recent window; 1/s before there is any measurement."""
        now = self.clock.now()
        while self._dequeued_at and now - self._dequeued_at[0] > DRAIN_WINDOW_S:
            self._dequeued_at.popleft()
        if len(self._dequeued_at) < 2:
            return 1.0
        span = max(now - self._dequeued_at[0], 1e-3)
        return len(self._dequeued_at) / span

    def retry_after(self) -> int:
        """Whole seconds, drawn uniformly from 1 to twice the expected wait for the queue to
        drain (full jitter), so the refused spread out instead of returning together; with
        retry_jitter off, the expected wait itself (rounded up, at least 1)."""
        expected = len(self._items) / self.drain_rate()
        if not self.defences.retry_jitter:
            return max(1, math.ceil(expected))
        return self.rng.randint(1, max(2, math.ceil(2 * expected)))

    def _expire(self) -> None:
        if not self.defences.deadline_recheck:
            return  # the failure: late requests stay queued and get dispatched
        now = self.clock.now()
        while self._items and self._items[0].deadline is not None and now > self._items[0].deadline:
            self._expired.append(self._items.popleft())
            self.num_expired += 1
        # Deadlines are stamped in arrival order with one deadline_s, so only the head can be the
        # oldest; requests behind it expire when they reach the head.
