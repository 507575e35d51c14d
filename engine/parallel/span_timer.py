"""How long a rank's device worked: the all-reduce time a step waited and each pipeline stage's
busy span (engine/parallel/collectives.py, engine/parallel/distributed.py, engine/parallel/rank_worker.py).

On the CPU the work runs while the host calls it, so the clock's readings are the span. On CUDA
the host only queues the work and moves on (a clock read then times the launch), so a span is a
pair of torch.cuda.Event(enable_timing=True) recorded on the current stream, read once the step
has synchronised: its length from elapsed_time, and its place on the host clock from an anchor
event recorded and synchronised at read time (the host reads the clock as the anchor completes;
every earlier event lies elapsed_time before it)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch


class SpanTimer:
    """Spans of one process's device work, oldest first (at most `limit` unread)."""

    def __init__(self, device: str, clock: Callable[[], float] = time.monotonic, limit: int = 64) -> None:
        self.cuda = device.startswith("cuda")
        self.clock = clock  # CLOCK_MONOTONIC by default: one clock for every process here
        self.opened: Any = None
        self.done: deque[tuple[Any, Any]] = deque(maxlen=limit)

    def start(self) -> None:
        self.opened = self._mark()

    def stop(self) -> None:
        """End the span start() opened (nothing without one)."""
        if self.opened is not None:
            self.done.append((self.opened, self._mark()))
            self.opened = None

    def __len__(self) -> int:
        return len(self.done)

    def durations_s(self) -> list[float]:
        """Every finished span's length in seconds, and forget them. CUDA: waits for the last to
        end (the others are before it on the same stream)."""
        spans = list(self.done)
        self.done.clear()
        if not self.cuda:
            return [end - start for start, end in spans]
        if spans:
            spans[-1][1].synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in spans]

    def spans(self, count: int) -> list[tuple[float, float]]:
        """The oldest `count` finished spans as (start, end) on the clock, and forget them. CUDA:
        waits for all the work queued so far (where the caller synchronises anyway, at no cost)."""
        taken = [self.done.popleft() for _ in range(min(count, len(self.done)))]
        if not self.cuda or not taken:
            return taken
        anchor = self._mark()
        anchor.synchronize()
        now = self.clock()
        return [(now - s.elapsed_time(anchor) / 1e3, now - e.elapsed_time(anchor) / 1e3) for s, e in taken]

    def _mark(self) -> Any:
        if not self.cuda:
            return self.clock()
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # on the current stream: it completes once the work queued before it has
        return event
