"""Driving the scheduler without a model (tests/test_scheduler.py, test_kv_watermark.py): a fake
step appends a token to every sequence that caught up, as the runner would."""

from __future__ import annotations

from engine.clock import VirtualClock
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.sequence import RequestTimes, Sequence
from engine.sampling_params import SamplingParams

BS = 4


def seq(rid: str, prompt_len: int, clock: VirtualClock, max_tokens: int = 8) -> Sequence:
    return Sequence(rid, [7] * prompt_len, SamplingParams(max_tokens=max_tokens), RequestTimes(arrival=clock.now()))


def fake_step(sched: Scheduler) -> SchedulerOutput:
    out = sched.schedule()
    for s, n in zip(out.seqs, out.num_new_tokens):
        s.num_computed_tokens += n
        sched.kv.cache_full_blocks(s)
        if s.num_computed_tokens == s.num_tokens:
            s.output_token_ids.append(1)
            if len(s.output_token_ids) >= s.params.max_tokens:
                sched.remove(s)
    return out
