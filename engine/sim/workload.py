"""The simulated clients' requests, from the load generator's own processes: gamma arrivals
(Poisson at burstiness 1, rescaled as vLLM does) and uniform lengths around the means, seeded;
a shared system prompt at the head of a share of them (engine/serving/load/prompt_mix.py)."""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.prompt_ids import TokenRuns
from engine.core.sequence import Sequence as EngineSequence
from engine.sampling_params import SamplingParams
from engine.serving.load.loadgen import arrival_times, draw_length
from engine.serving.load.prompt_mix import Conversations, OpenTurns, PromptMix, compact_system_ids, next_turn, pick_turn


@dataclass
class SimRequest:
    request_id: str
    arrival: float
    prompt_len: int  # the whole prompt, a system prompt at its head included
    max_tokens: int
    system_len: int = 0  # the shared system prompt's tokens at its head (engine/serving/load/prompt_mix.py)

    def own_ids(self, vocab: int) -> range:
        """The request's own part, distinct from every other's (no shared prefix, as vLLM's random
        dataset): a run of ids from a per-request start. The cost model reads lengths only, so the
        ids need no RNG draws. The run is a range: 48 bytes however long, where a list is 8 KB of
        pointers a prompt, and an over-capacity run queues 70,000 of them (the engine keeps it a
        range: engine/core/prompt_ids.py)."""
        n = self.prompt_len - self.system_len
        start = 100 + (int(self.request_id) * 7919) % max(1, vocab - n - 200)
        return range(start, start + n)

    def token_ids(self, vocab: int) -> Sequence[int]:
        """The prompt: its own part, after the system prompt if it carries one (TokenRuns: still a
        few hundred bytes, and the system prompt's blocks hash alike in every carrier)."""
        own = self.own_ids(vocab)
        return TokenRuns((compact_system_ids(self.system_len), own)) if self.system_len else own


@functools.cache
def sim_params(max_tokens: int) -> SamplingParams:
    """A simulated request's sampling: greedy, exactly max_tokens long (EOS ignored). One object
    per length, shared by every request of it: an engine never changes a request's params, and a
    big run made and checked 180,000 alike."""
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


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
    burstiness: float = 1.0, seed: int = 0, burst: Burst | None = None, system_prompt_tokens: int = 0,
    system_prompt_share: float = 1.0,
) -> list[SimRequest]:
    """Seeded arrivals and lengths; with a system prompt, the share of requests that carry it start
    with it (prompt_mix's draws: without one, the same draws as ever, so the same requests)."""
    times = arrival_times(rate, num_requests, burstiness, seed)
    if burst is not None:
        times = [burst.warp(t) for t in times]
    rng = random.Random(seed)
    mix = PromptMix(input_tokens, system_prompt_tokens, system_prompt_share, range_ratio=range_ratio)
    requests = []
    for i, t in enumerate(times):
        turn = next_turn(mix, rng)
        n_out = draw_length(rng, output_tokens, range_ratio)
        requests.append(SimRequest(str(i), t, turn.system_len + turn.own_len, n_out, turn.system_len))
    return requests


class ListConversations:
    """conversation_turns over a request list (engine/sim/run.py, fleet_run.py): each arrival
    continues the oldest answered conversation with its own part as the new message, else starts
    one (with the system prompt if it carries it). The list's arrivals and lengths are the same on
    both sides of an A/B; which conversation an arrival continues depends on the answers so far."""

    def __init__(self, mix: PromptMix, vocab: int, max_prompt: int) -> None:
        self.mix, self.vocab, self.max_prompt = mix, vocab, max_prompt
        self.open = OpenTurns(Conversations())

    def prompt(self, r: SimRequest) -> Sequence[int]:
        own = r.prompt_len - r.system_len
        turn = pick_turn(self.mix, self.open.conversations, self.max_prompt, lambda: r.system_len > 0, lambda _: own)
        ids = turn.build(r.own_ids(self.vocab), compact_system_ids, compact=True)
        self.open.sent(r.request_id, turn)
        return ids

    def answered(self, seq: EngineSequence) -> None:
        self.open.answered(seq, self.mix.conversation_turns)

    def failed(self, request_id: str) -> None:
        """Refused or failed: its conversation ends."""
        self.open.ended(request_id, None, 0)
