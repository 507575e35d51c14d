"""One pipeline stage's busy time, as its rank (or the what-if replica) reports it: its busy share
and its busy time per step over the latest STAGE_WINDOW_S. No torch: the simulated lab reads it too."""

from __future__ import annotations

from collections import deque

STAGE_WINDOW_S = 5.0  # the per-stage busy and idle shares are over about this long


class StageClock:
    """One stage's busy time, a span per batch it ran: its busy share and busy time per step over
    the latest STAGE_WINDOW_S."""

    def __init__(self) -> None:
        self.busy_s, self.steps = 0.0, 0
        self.samples: deque[tuple[float, float, int]] = deque()  # (time, busy_s, steps) so far

    def record(self, start: float, end: float) -> None:
        """The stage worked on one batch from start to end."""
        self.busy_s += end - start
        self.steps += 1
        self.samples.append((end, self.busy_s, self.steps))
        while len(self.samples) > 2 and end - self.samples[1][0] >= STAGE_WINDOW_S:
            self.samples.popleft()

    def idle_share(self, now: float) -> float:
        """Idle over the window up to now: a stage that has not reported since has been idle."""
        if len(self.samples) < 2:
            return 0.0
        (t0, b0, _), (_, b1, _) = self.samples[0], self.samples[-1]
        return min(1.0, max(0.0, 1 - (b1 - b0) / (now - t0))) if now > t0 else 0.0

    def busy_ms_per_step(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (_, b0, n0), (_, b1, n1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (n1 - n0) * 1e3 if n1 > n0 else 0.0
