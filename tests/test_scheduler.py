"""Scheduler decisions, driven without a model: a fake step appends a token to every sequence
that caught up, as the runner would."""

from __future__ import annotations

import pytest

from engine.clock import VirtualClock
from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.contiguous_allocator import ContiguousAllocator
from engine.core.scheduler import Scheduler
from engine.core.sequence import SequenceStatus
from engine.core.static_scheduler import StaticScheduler
from engine.errors import InvalidParamError
from tests.support.scheduler_fakes import BS, fake_step, seq

pytestmark = pytest.mark.unit


def make(num_blocks: int = 64, clock: VirtualClock | None = None, **levers: object) -> Scheduler:
    config = EngineConfig(block_size=BS, **levers)  # type: ignore[arg-type]
    return Scheduler(config, BlockManager(num_blocks, BS, config.prefix_caching), clock or VirtualClock())


def test_chunked_prefill_interleaves_with_decodes() -> None:
    clock = VirtualClock()
    sched = make(max_batched_tokens=16, prefix_caching=False)
    short = seq("short", 3, clock)
    sched.add(short)
    fake_step(sched)  # short's prompt
    long = seq("long", 40, clock)
    sched.add(long)
    out = fake_step(sched)
    assert dict(zip([s.request_id for s in out.seqs], out.num_new_tokens)) == {"short": 1, "long": 15}
    out = fake_step(sched)
    assert out.num_new_tokens == [1, 15]
    assert long.num_computed_tokens == 30 and not long.output_token_ids


def test_without_chunking_a_prompt_waits_for_room_in_the_budget() -> None:
    clock = VirtualClock()
    sched = make(max_batched_tokens=16, chunked_prefill=False, prefix_caching=False)
    for name in ("a", "b"):
        sched.add(seq(name, 3, clock))
    fake_step(sched)
    sched.add(seq("c", 15, clock))
    out = fake_step(sched)
    assert [s.request_id for s in out.seqs] == ["a", "b"]  # 15 tokens do not fit beside two decodes
    sched.remove(sched.running[0])
    out = fake_step(sched)
    assert out.num_new_tokens == [1, 15]


def test_without_chunking_a_prompt_longer_than_the_budget_runs_whole() -> None:
    """vLLM's unchunked rule: the budget never splits or holds back a prompt that could never fit
    it; it runs whole beside the decodes (the chunked_prefill row's ITL spike), one such a step."""
    clock = VirtualClock()
    sched = make(max_batched_tokens=16, chunked_prefill=False, prefix_caching=False)
    sched.add(seq("a", 3, clock))
    fake_step(sched)
    sched.add(seq("b", 40, clock))
    sched.add(seq("c", 40, clock))
    out = fake_step(sched)
    assert dict(zip([s.request_id for s in out.seqs], out.num_new_tokens)) == {"a": 1, "b": 40}


def test_preempts_newest_first_and_admits_nothing_that_step() -> None:
    clock = VirtualClock()
    sched = make(num_blocks=6, prefix_caching=False)
    old, new = seq("old", 8, clock, max_tokens=30), seq("new", 8, clock, max_tokens=30)
    sched.add(old)
    sched.add(new)
    fake_step(sched)  # each holds 2 blocks + its first token
    sched.add(seq("late", 3, clock))
    preempting = None
    for _ in range(20):
        out = fake_step(sched)
        if out.preempted:
            preempting = out
            break
    assert preempting is not None
    assert [s.request_id for s in preempting.preempted] == ["new"]
    assert not preempting.admitted
    assert new.num_computed_tokens == 0 and new.block_table == [] and new.num_preemptions == 1
    assert sched.waiting[0] is new


def test_oldest_waiter_past_the_bound_is_not_overtaken() -> None:
    clock = VirtualClock()
    sched = make(num_blocks=8, clock=clock, prefix_caching=False, starvation_s=5.0, max_num_seqs=8)
    resident = seq("resident", 16, clock, max_tokens=1000)
    sched.add(resident)
    fake_step(sched)  # holds 5 of 8 blocks
    big = seq("big", 20, clock)  # needs 5 blocks: cannot fit beside the resident
    sched.add(big)
    clock.advance(1)
    small = seq("small", 3, clock, max_tokens=2)
    sched.add(small)
    out = fake_step(sched)
    assert small in out.admitted  # before the bound, a request that fits may skip ahead
    for _ in range(3):
        fake_step(sched)
    clock.advance(10)  # big has now waited past the bound
    late = seq("late", 3, clock, max_tokens=2)
    sched.add(late)
    for _ in range(3):
        out = fake_step(sched)
        assert late not in out.admitted  # the reserved slot: nobody overtakes big
    sched.remove(resident)
    out = fake_step(sched)
    assert out.admitted[0] is big


def test_static_batches_run_to_completion_before_the_next_forms() -> None:
    clock = VirtualClock()
    config = EngineConfig(block_size=BS, paged=False, max_num_seqs=2)
    sched = StaticScheduler(config, ContiguousAllocator(64, BS), clock)  # type: ignore[arg-type]
    a, b, c = seq("a", 5, clock, max_tokens=2), seq("b", 5, clock, max_tokens=6), seq("c", 5, clock)
    for s in (a, b, c):
        sched.add(s)
    out = fake_step(sched)
    assert out.admitted == [a, b] and out.num_new_tokens == [5, 5]
    assert len(a.block_table) == 2 and len(b.block_table) == 3  # prompt + max_tokens reserved
    while b in sched.running:
        out = fake_step(sched)
        assert c not in out.admitted
    out = fake_step(sched)
    assert out.admitted == [c]


def test_reserve_admission_never_preempts_where_greedy_does() -> None:
    """Six requests of 4 prompt + 12 output tokens (4 blocks each at the end) on 12 blocks:
    greedy admits all six on their prompts and preempts as they grow; reserve (TensorRT-LLM's
    guaranteed-no-evict) admits three, whose whole length fits, and preempts nothing."""
    for policy, admitted_first, preempts in (("greedy", 6, True), ("reserve", 3, False)):
        clock = VirtualClock()
        sched = make(12, clock, admission=policy, prefix_caching=False, max_batched_tokens=64)
        seqs = [seq(f"r{i}", 4, clock, max_tokens=12) for i in range(6)]
        for s in seqs:
            sched.add(s)
        assert len(fake_step(sched).admitted) == admitted_first
        while sched.running or sched.waiting:
            fake_step(sched)
        assert (sched.num_preemptions > 0) is preempts
        assert all(len(s.output_token_ids) == 12 for s in seqs)
        assert sched.kv.num_free_blocks == 12


def test_a_sequence_in_a_pipeline_stage_is_neither_scheduled_nor_preempted() -> None:
    """Pipeline parallelism keeps batches in flight: a sequence in one waits for it to land, and
    when blocks run out the newest sequence not in flight is the one preempted."""
    clock = VirtualClock()
    sched = make(num_blocks=4, max_batched_tokens=64)  # 16 tokens of KV
    a, b = seq("a", 4, clock, max_tokens=20), seq("b", 4, clock, max_tokens=20)
    sched.add(a)
    sched.add(b)
    fake_step(sched)  # both prompts: a block each, full
    b.in_flight = True  # b's batch is still in the stages
    out = sched.schedule()
    assert [s.request_id for s in out.seqs] == ["a"]
    a.in_flight = True
    assert not sched.schedule().seqs  # both in flight: nothing to run
    a.in_flight = b.in_flight = False
    out = sched.schedule(max_continuing=1)  # a pipelined replica's share of the running
    assert [s.request_id for s in out.seqs] == ["a"]
    for s, n in zip(out.seqs, out.num_new_tokens):
        s.num_computed_tokens += n
        s.output_token_ids.append(1)
    # Fill the cache, then let a need a block while b (the newest) is in flight: a preempts itself.
    a.num_computed_tokens = b.num_computed_tokens = 8
    a.output_token_ids, b.output_token_ids = [1] * 4, [1] * 4
    sched.kv.allocate(a, 4)
    sched.kv.allocate(b, 4)
    a.num_computed_tokens, a.output_token_ids = 12, [1] * 9
    b.in_flight = True
    out = sched.schedule()
    assert a in out.preempted and b not in out.preempted and b.status.name == "RUNNING"


# The 2024 engines' policies (EngineConfig.prefill_first, scheduler_steps) -------------------------


def policy_step(sched: Scheduler) -> dict[str, int]:
    """fake_step, ending a sequence as the engine does (FINISHED, then removed); {id: tokens}."""
    out = sched.schedule()
    for s, n in zip(out.seqs, out.num_new_tokens):
        s.num_computed_tokens += n
        if s.num_computed_tokens == s.num_tokens:
            s.output_token_ids.append(1)
            if len(s.output_token_ids) >= s.params.max_tokens:
                s.status = SequenceStatus.FINISHED
                sched.remove(s)
    return dict(zip([s.request_id for s in out.seqs], out.num_new_tokens))


def test_prefill_first_runs_a_new_prompt_in_a_step_of_its_own() -> None:
    """vLLM v0 without chunked prefill and SGLang 0.3: an arrival's prompt stalls every running
    decode for one step; with nothing to prefill, the decodes run alone."""
    clock = VirtualClock()
    sched = make(max_batched_tokens=64, chunked_prefill=False, prefix_caching=False, prefill_first=True)
    sched.add(seq("a", 3, clock))
    assert policy_step(sched) == {"a": 3}
    assert policy_step(sched) == {"a": 1}
    sched.add(seq("b", 5, clock))
    sched.add(seq("c", 6, clock))
    assert policy_step(sched) == {"b": 5, "c": 6}  # a skips this step
    assert policy_step(sched) == {"a": 1, "b": 1, "c": 1}
    mixed = make(max_batched_tokens=64, chunked_prefill=False, prefix_caching=False)
    mixed.add(seq("a", 3, clock))
    policy_step(mixed)
    mixed.add(seq("b", 5, clock))
    assert policy_step(mixed) == {"a": 1, "b": 5}  # the default: the prompt joins the decodes' step


def test_prefill_first_with_chunking_finishes_a_long_prompt_before_the_decodes_go_on() -> None:
    clock = VirtualClock()
    sched = make(max_batched_tokens=16, prefix_caching=False, prefill_first=True)
    sched.add(seq("a", 3, clock))
    policy_step(sched)
    sched.add(seq("long", 40, clock))
    assert [policy_step(sched) for _ in range(4)] == [{"long": 16}, {"long": 16}, {"long": 8}, {"a": 1, "long": 1}]


def test_multi_step_runs_a_decode_batch_without_looking_at_the_queue() -> None:
    """vLLM 0.6's --num-scheduler-steps: a decode batch runs N steps; a prompt that arrives
    meanwhile waits for the run to end, then runs alone (a prefill is always a single step)."""
    clock = VirtualClock()
    sched = make(max_batched_tokens=64, chunked_prefill=False, prefix_caching=False, prefill_first=True, scheduler_steps=4)
    sched.add(seq("a", 3, clock, max_tokens=20))
    sched.add(seq("b", 3, clock, max_tokens=3))
    assert policy_step(sched) == {"a": 3, "b": 3}
    assert sched.run_steps_left == 0  # a prefill is a single step
    assert policy_step(sched) == {"a": 1, "b": 1}  # a run of 4 begins
    assert (sched.run_steps_left, sched.runs_started) == (3, 1)
    sched.add(seq("c", 4, clock))
    assert policy_step(sched) == {"a": 1, "b": 1}  # c waits; b reaches its 3 tokens here
    assert policy_step(sched) == {"a": 1}  # the rest of the run goes on without b
    assert policy_step(sched) == {"a": 1}
    assert sched.run_steps_left == 0
    assert policy_step(sched) == {"c": 4}  # the run is over: c's prompt, alone
    assert policy_step(sched) == {"a": 1, "c": 1}
    assert sched.runs_started == 2


def test_a_run_whose_members_all_finished_ends_early() -> None:
    clock = VirtualClock()
    sched = make(max_batched_tokens=64, chunked_prefill=False, prefix_caching=False, scheduler_steps=8)
    sched.add(seq("a", 3, clock, max_tokens=2))
    policy_step(sched)
    assert policy_step(sched) == {"a": 1}  # a's last token, the run's first step
    sched.add(seq("b", 3, clock))
    assert policy_step(sched) == {"b": 3}  # nobody left in the run: the scheduler looks again
    assert sched.run_steps_left == 0


@pytest.mark.parametrize(
    ("levers", "param"),
    [
        ({"scheduler_steps": 0}, "scheduler_steps"),
        ({"scheduler_steps": 2.5}, "scheduler_steps"),
        ({"scheduler_steps": 4, "pipeline_parallel": 2}, "scheduler_steps"),
        ({"prefill_first": True, "paged": False}, "prefill_first"),
        ({"prefill_first": "yes"}, "prefill_first"),
    ],
)
def test_the_policies_are_validated_naming_the_field(levers: dict, param: str) -> None:
    with pytest.raises(InvalidParamError) as err:
        EngineConfig(**levers)
    assert err.value.param == param
