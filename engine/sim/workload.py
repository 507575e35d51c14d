"""The simulated clients' requests, from the load generator's own processes: gamma arrivals
(Poisson at burstiness 1, rescaled as vLLM does) and uniform lengths around the means, seeded."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from engine.serving.load.loadgen import arrival_times, draw_length


@dataclass
class SimRequest:
    request_id: str
    arrival: float
    prompt_len: int
    max_tokens: int

    def token_ids(self, vocab: int) -> Sequence[int]:
        """Distinct prompts (no shared prefix, as vLLM's random dataset): a run of ids from a
        per-request start. The cost model reads lengths only, so the ids need no RNG draws. The
        run is a range: 48 bytes however long, where a list is 8 KB of pointers a prompt, and an
        over-capacity run queues 70,000 of them (the engine keeps it a range: engine/prompt_ids.py)."""
        start = 100 + (int(self.request_id) * 7919) % max(1, vocab - self.prompt_len - 200)
        return range(start, start + self.prompt_len)


@dataclass(frozen=True)
class Burst:
    """The rate times `factor` for `duration_s` from `at_s` (simulated seconds), as a time change
    of the same arrivals: the ones that would have come in factor * duration_s come in duration_s,
    and the rest come (factor - 1) * duration_s earlier. Poisson stays Poisson, at the higher rate
    inside the window."""

    factor: float = 1.0
    at_s: float = 0.0
    duration_s: float = 0.0

    def warp(self, t: float) -> float:
        """An arrival's time at the steady rate -> its time with the burst."""
        start, stretched = self.at_s, self.factor * self.duration_s
        if t <= start or self.factor == 1.0:
            return t
        if t <= start + stretched:
            return start + (t - start) / self.factor
        return t - stretched + self.duration_s


def make_workload(
    num_requests: int, rate: float, input_tokens: int, output_tokens: int, range_ratio: float = 0.0,
    burstiness: float = 1.0, seed: int = 0, burst: Burst | None = None,
) -> list[SimRequest]:
    times = arrival_times(rate, num_requests, burstiness, seed)
    if burst is not None:
        times = [burst.warp(t) for t in times]
    rng = random.Random(seed)
    return [
        SimRequest(str(i), t, draw_length(rng, input_tokens, range_ratio), draw_length(rng, output_tokens, range_ratio))
        for i, t in enumerate(times)
    ]
