"""A plain (not autoscaled) run's timeline: what the live charts plot, sampled on the event loop
every `period_s` simulated seconds (on the router's poll) (queue depth, running, KV blocks, output tokens/s), and TTFT
p50/p99 over the live stream's sliding window, filled in once the run ends from each request's
first-token time (so a row counts a request at its first token, as the live metrics bus does).

The autoscaled run reads its rows off the fleet's own snapshots (fleet_run.py); both end up with
the same columns through `fill_ttft`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.clock import Clock
from engine.serving.routing.router import Router
from engine.serving.telemetry.metrics import WINDOW_S
from engine.sim.replica import SimReplica
from engine.sim.results import Recorder


@dataclass
class TimelineSampler:
    period_s: float
    replicas: Sequence[SimReplica]
    routers: Sequence[Router]
    clock: Clock
    rows: list[dict[str, Any]] = field(default_factory=list)
    _last: tuple[float, int] = (0.0, 0)  # (time, tokens) at the previous row

    def due(self) -> None:
        """A row if period_s has passed since the last one (the first row at the first call)."""
        if not self.rows or self.clock.now() >= self.rows[-1]["t"] + self.period_s - 1e-9:
            self.sample()

    def sample(self) -> None:
        now = self.clock.now()
        tokens = sum(r.tokens_out for r in self.replicas)
        span = now - self._last[0]
        self.rows.append(
            {
                "t": round(now, 3),
                "queue_depth": sum(len(rt.queue) for rt in self.routers),
                "running": sum(len(r.engine.scheduler.running) for r in self.replicas),
                "kv_used_blocks": sum(r.engine.kv.num_used_blocks for r in self.replicas),
                "kv_total_blocks": sum(r.engine.kv.num_blocks for r in self.replicas),
                "output_tok_s": (tokens - self._last[1]) / span if span > 0 else 0.0,
            }
        )
        self._last = (now, tokens)


def fill_ttft(rows: list[dict[str, Any]], rec: Recorder, window_s: float = WINDOW_S) -> None:
    """Each row's ttft_p50_s/ttft_p99_s: the requests whose first token came in the window
    before the row's time (None where none did, as a live chart leaves a gap)."""
    first = np.frombuffer(rec.first_at, dtype=np.float64)
    ttft = np.frombuffer(rec.ttft, dtype=np.float64)
    order = np.argsort(first, kind="stable")
    first, ttft = first[order], ttft[order]
    for row in rows:
        lo, hi = np.searchsorted(first, row["t"] - window_s, "right"), np.searchsorted(first, row["t"], "right")
        window = ttft[lo:hi]
        row["ttft_p50_s"] = float(np.percentile(window, 50)) if len(window) else None
        row["ttft_p99_s"] = float(np.percentile(window, 99)) if len(window) else None
