"""The scheduler with speculative guesses, driven without a model: a guessing decode takes 1 + k
tokens of the budget, fewer when the budget is short, and never preempts anyone for its guesses."""

from __future__ import annotations

import pytest

from engine.clock import VirtualClock
from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import RequestTimes, Sequence, SequenceStatus
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

BS = 4


def decoding(rid: str, prompt_len: int, kv: BlockManager, sched: Scheduler) -> Sequence:
    """A running decode: its prompt computed, one output token out, its blocks held."""
    seq = Sequence(rid, [7] * prompt_len, SamplingParams(max_tokens=64), RequestTimes(arrival=0.0))
    seq.output_token_ids.append(1)
    kv.admit(seq, [])
    assert kv.allocate(seq, prompt_len)
    seq.num_computed_tokens = prompt_len
    seq.status = SequenceStatus.RUNNING
    sched.running.append(seq)
    return seq


def make(num_blocks: int, **levers: object) -> tuple[Scheduler, BlockManager]:
    config = EngineConfig(block_size=BS, prefix_caching=False, num_speculative_tokens=4, **levers)  # type: ignore[arg-type]
    kv = BlockManager(num_blocks, BS, False)
    return Scheduler(config, kv, VirtualClock()), kv


def test_a_guessing_decode_takes_one_token_and_its_guesses() -> None:
    sched, kv = make(64)
    a, b = decoding("a", 6, kv, sched), decoding("b", 6, kv, sched)
    a.spec_token_ids = (5, 6, 7, 8)
    out = sched.schedule()
    assert dict(zip([s.request_id for s in out.seqs], out.num_new_tokens)) == {"a": 5, "b": 1}
    assert len(a.block_table) * BS >= a.num_computed_tokens + 5  # room for every guess's KV
    assert b.spec_token_ids == ()


def test_a_short_budget_trims_the_guesses() -> None:
    sched, kv = make(64, max_batched_tokens=3)
    a = decoding("a", 6, kv, sched)
    a.spec_token_ids = (5, 6, 7, 8)
    out = sched.schedule()
    assert out.num_new_tokens == [3] and a.spec_token_ids == (5, 6)


def test_guesses_never_preempt_and_drop_when_blocks_are_short() -> None:
    """Two running decodes fill the cache but a slot each: the guesses would need a new block,
    so the decode takes its one token, and nobody is preempted."""
    sched, kv = make(4)
    a, b = decoding("a", 7, kv, sched), decoding("b", 7, kv, sched)  # 2 blocks each, 1 slot left each
    assert kv.num_free_blocks == 0
    a.spec_token_ids = (5, 6, 7)
    out = sched.schedule()
    assert out.num_new_tokens == [1, 1] and not out.preempted
    assert a.spec_token_ids == () and sched.running == [a, b]


def test_a_preempted_decode_forgets_its_guesses() -> None:
    sched, kv = make(4)
    a, b = decoding("a", 8, kv, sched), decoding("b", 8, kv, sched)  # full blocks: each needs one more
    b.spec_token_ids = (5, 6)
    out = sched.schedule()
    assert out.preempted == [b] and b.spec_token_ids == () and b.num_computed_tokens == 0
    assert out.seqs == [a]
