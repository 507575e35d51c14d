"""The event log: discrete things that happened (admitted, rejected, preempted, finished,
cancelled, replica state changes, lever changes, autoscaler decisions), in order, for the
live timeline. Readers poll with a cursor, so a slow reader never blocks a writer."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from engine.clock import WALL_CLOCK, Clock

KINDS = (
    "admitted",
    "rejected",
    "preempted",
    "finished",
    "cancelled",
    "replica",
    "config",
    "flood",
    "scale",
    "remote",  # a remote backend's errors and its comings and goings (issue 17)
)


class EventLog:
    def __init__(self, clock: Clock = WALL_CLOCK, keep: int = 2000) -> None:
        self.clock = clock
        self._events: deque[dict[str, Any]] = deque(maxlen=keep)
        self._next = 0
        self._lock = threading.Lock()

    def emit(self, kind: str, message: str, **data: Any) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        with self._lock:
            self._events.append({"seq": self._next, "time": self.clock.now(), "kind": kind, "message": message, **data})
            self._next += 1

    @property
    def next_seq(self) -> int:
        """The seq the next event will get: a reader starting here sees only what comes after."""
        with self._lock:
            return self._next

    def since(self, cursor: int, limit: int = 200) -> tuple[list[dict[str, Any]], int]:
        """Events with seq >= cursor (at most limit, the newest kept) and the next cursor."""
        with self._lock:
            fresh = [e for e in self._events if e["seq"] >= cursor]
            return fresh[-limit:], self._next

    def recent(self, kind: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self._events if kind is None or e["kind"] == kind][-limit:]
