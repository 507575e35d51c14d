"""The simulated clients' requests, from the load generator's own processes: gamma arrivals
(Poisson at burstiness 1, rescaled as vLLM does) and uniform lengths around the means, seeded."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from engine.serving.loadgen import arrival_times, draw_length


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
        over-capacity run queues 70,000 of them (the engine copies it into a list on admission)."""
        start = 100 + (int(self.request_id) * 7919) % max(1, vocab - self.prompt_len - 200)
        return range(start, start + self.prompt_len)


def make_workload(
    num_requests: int, rate: float, input_tokens: int, output_tokens: int, range_ratio: float = 0.0,
    burstiness: float = 1.0, seed: int = 0,
) -> list[SimRequest]:
    times = arrival_times(rate, num_requests, burstiness, seed)
    rng = random.Random(seed)
    return [
        SimRequest(str(i), t, draw_length(rng, input_tokens, range_ratio), draw_length(rng, output_tokens, range_ratio))
        for i, t in enumerate(times)
    ]
