"""The remote's errors in the event timeline, as they are (status, Retry-After, the remote's own
message), but rate-limited: the first error of a kind in each SUMMARY_S seconds is one event,
and the rest of that window are summed into one "and N more" event, so a flood of 429s reads
as a line a second or two, not thousands. A kind is the HTTP status, or "unreachable" for a
connection that failed. Fed by the lab's clients (lab_clients.RefusalHook) and by the app's
pass-through (the prompt box, a class flood); flushed by the remote lab's poller."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from engine.clock import WALL_CLOCK, Clock
from engine.lab.remote.remote_backend import error_message
from engine.serving.telemetry.events import EventLog

SUMMARY_S = 2.0
EVENT_KIND = "remote"


@dataclass
class _Window:
    opened: float
    suppressed: int = 0
    retry_after: set[str] = field(default_factory=set)
    sources: set[str] = field(default_factory=set)


class RemoteErrors:
    def __init__(self, events: EventLog, clock: Clock = WALL_CLOCK, summary_s: float = SUMMARY_S) -> None:
        self.events = events
        self.clock = clock
        self.summary_s = summary_s
        self.counts: dict[str, int] = {}  # every error by kind, since the lab started
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def report(self, source: str, status: int | None, retry_after: str | None, body: str) -> None:
        """One error the remote (or the way to it) gave `source`."""
        if status is not None and status < 400:
            return
        kind = "unreachable" if status is None else str(status)
        self.flush()  # a window that has closed is summed up before a new one opens
        now = self.clock.now()
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            window = self._windows.get(kind)
            if window is not None and now - window.opened < self.summary_s:
                window.suppressed += 1
                window.sources.add(source)
                if retry_after:
                    window.retry_after.add(retry_after)
                return
            self._windows[kind] = _Window(now)
        text = error_message(status, body) if status is not None else f"unreachable: {body}"
        wait = f" (Retry-After: {retry_after} s)" if retry_after else ""
        self.events.emit(EVENT_KIND, f"{source}: remote {text}{wait}", status=status, retry_after=retry_after)

    def flush(self) -> None:
        """Summarise the windows that have closed (called several times a second)."""
        now = self.clock.now()
        with self._lock:
            closed = {k: w for k, w in self._windows.items() if now - w.opened >= self.summary_s}
            for kind in closed:
                del self._windows[kind]
        for kind, window in closed.items():
            if not window.suppressed:
                continue
            waits = sorted(window.retry_after, key=lambda v: (len(v), v))
            wait = (
                f", Retry-After {waits[0]}-{waits[-1]} s"
                if len(waits) > 1
                else (f", Retry-After {waits[0]} s" if waits else "")
            )
            what = "failed connections" if kind == "unreachable" else f"{kind}s"
            self.events.emit(
                EVENT_KIND,
                f"and {window.suppressed} more {what} from the remote in {self.summary_s:g} s"
                f" ({', '.join(sorted(window.sources))}{wait})",
                status=None if kind == "unreachable" else int(kind),
                count=window.suppressed,
            )
