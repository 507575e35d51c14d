"""Prompts that share prefixes (engine/serving/load/prompt_mix.py): one system prompt at the head
of a share of the requests, conversations that resend their history, the same draws for the live
traffic, the simulated lab and the simulator's request lists, and the compact ids a what-if prompt
keeps (engine/core/prompt_ids.py TokenRuns). No model: lengths, ids and hashes only."""

from __future__ import annotations

import random
import statistics

import pytest

from engine.core.block_manager import BlockManager
from engine.core.prompt_ids import TokenRuns, checked_prompt_ids
from engine.core.sequence import RequestTimes, Sequence
from engine.errors import InvalidParamError
from engine.lab.traffic import TrafficDriver
from engine.levers import LEVERS
from engine.sampling_params import SamplingParams
from engine.serving.load.loadgen import VOCAB, draw_length
from engine.serving.load.prompt_mix import (
    Conversations,
    PromptMix,
    SystemPrompts,
    Turn,
    compact_system_ids,
    next_turn,
)
from engine.serving.routing.prefix_memory import prefix_keys
from engine.sim.workload import SimRequest, make_workload

pytestmark = pytest.mark.unit

DEFAULTS = {key: lever.default for key, lever in LEVERS.items()}


def build(turn: Turn, rng: random.Random, system: SystemPrompts) -> list[int]:
    """A live prompt: the own part's random ids, as the lab's traffic draws them."""
    return list(turn.build([rng.randrange(*VOCAB) for _ in range(turn.own_len)], system.ids))


def test_the_new_levers_are_load_levers_with_their_ranges() -> None:
    for key, default, low, high in (("system_prompt_tokens", 0, 0, 32768), ("system_prompt_share", 1.0, 0, 1),
                                    ("conversation_turns", 1, 1, 16)):  # fmt: skip
        lever = LEVERS[key]
        assert (lever.default, lever.minimum, lever.maximum, lever.apply, lever.group) == (default, low, high, "load", "")
        with pytest.raises(InvalidParamError) as err:
            lever.validate(high + 1)
        assert err.value.param == key


def test_carriers_open_with_one_fixed_system_prompt_and_the_share_holds() -> None:
    mix = PromptMix(prompt_tokens=100, system_prompt_tokens=64, system_prompt_share=0.3)
    rng, system = random.Random(7), SystemPrompts(seed=7)
    head = system.ids(64)
    assert head == SystemPrompts(seed=7).ids(64) != SystemPrompts(seed=8).ids(64)  # fixed per seed
    assert system.ids(80)[:64] == head  # a longer system prompt starts with the shorter one
    carriers = 0
    for _ in range(4000):
        turn = next_turn(mix, rng)
        ids = build(turn, rng, system)
        assert all(VOCAB[0] <= t < VOCAB[1] for t in ids)
        if turn.system_len:
            carriers += 1
            assert turn.system_len == 64 and ids[:64] == head and len(ids) == 64 + turn.own_len
        else:
            assert ids[:64] != head and len(ids) == turn.own_len
    assert carriers / 4000 == pytest.approx(0.3, abs=0.025)


def test_prompt_tokens_stays_the_whole_prompts_mean() -> None:
    rng = random.Random(1)
    mix = PromptMix(prompt_tokens=200, system_prompt_tokens=150)
    turns = [next_turn(mix, rng) for _ in range(3000)]
    assert all(t.system_len == 150 for t in turns)  # share 1: every request carries it
    assert statistics.mean(t.own_len for t in turns) == pytest.approx(50, rel=0.03)  # drawn around 200 - 150
    assert statistics.mean(t.prompt_len for t in turns) == pytest.approx(200, rel=0.01)
    half = PromptMix(prompt_tokens=200, system_prompt_tokens=150, system_prompt_share=0.5)
    whole = [next_turn(half, rng) for _ in range(3000)]
    assert statistics.mean(t.prompt_len for t in whole) == pytest.approx(200, rel=0.02)  # the share moves no load
    longer = [next_turn(PromptMix(prompt_tokens=100, system_prompt_tokens=300), rng) for _ in range(20)]
    assert {t.own_len for t in longer} == {1}  # a system prompt past prompt_tokens leaves one own token


def test_without_a_shared_prefix_the_draws_are_the_plain_traffics() -> None:
    """A seeded run without a system prompt draws what it drew before prompt_mix existed."""
    old = random.Random(3)
    expected = [(draw_length(old, 1000, 0.5), draw_length(old, 250, 0.5)) for _ in range(200)]
    assert [(r.prompt_len, r.max_tokens) for r in make_workload(200, 5.0, 1000, 250, 0.5, seed=3)] == expected
    assert all(isinstance(r.token_ids(128256), range) for r in make_workload(20, 5.0, 1000, 250, 0.5, seed=3))
    levers = DEFAULTS | {"prompt_tokens": 40, "output_tokens": 8}
    traffic, old = TrafficDriver(None, lambda: levers, seed=5), random.Random(5)
    for _ in range(20):
        n_in, n_out = draw_length(old, 40, 0.5), draw_length(old, 8, 0.5)
        request = traffic.next_request()
        assert request.prompt_token_ids == [old.randrange(*VOCAB) for _ in range(n_in)]
        assert request.max_tokens == n_out and request.conversation is None


def test_a_later_turn_resends_the_last_prompt_and_its_answer_then_a_new_message() -> None:
    mix = PromptMix(prompt_tokens=40, system_prompt_tokens=16, conversation_turns=3)
    rng, system, pool = random.Random(2), SystemPrompts(), Conversations()
    first = next_turn(mix, rng, pool)
    prompt1 = build(first, rng, system)
    assert first.conversation is not None and first.conversation.turns == 1 and prompt1[:16] == system.ids(16)
    pool.ended(first.conversation, [5, 6, 7], mix.conversation_turns)  # answered: it may go on
    second = next_turn(mix, rng, pool)
    assert second.conversation is first.conversation
    prompt2 = build(second, rng, system)
    assert prompt2[: len(prompt1) + 3] == [*prompt1, 5, 6, 7] and len(prompt2) == len(prompt1) + 3 + second.own_len
    pool.ended(second.conversation, [8], mix.conversation_turns)
    third = next_turn(mix, rng, pool)
    prompt3 = build(third, rng, system)
    assert third.conversation is first.conversation and prompt3[: len(prompt2) + 1] == [*prompt2, 8]
    pool.ended(third.conversation, [9], mix.conversation_turns)  # its third turn: the conversation is over
    assert next_turn(mix, rng, pool).conversation is not first.conversation
    failed = next_turn(mix, rng, pool)
    pool.ended(failed.conversation, None, mix.conversation_turns)  # refused or failed: it ends
    pool.ended(failed.conversation, [], mix.conversation_turns)  # answered without its ids: it ends too
    assert len(pool) == 0


def test_arrivals_continue_the_oldest_answered_conversation_else_start_one() -> None:
    mix = PromptMix(prompt_tokens=20, conversation_turns=4)
    rng, pool = random.Random(4), Conversations()
    a, b, c = (next_turn(mix, rng, pool) for _ in range(3))  # nothing answered yet: three new ones
    assert len({id(t.conversation) for t in (a, b, c)}) == 3
    for turn in (a, b, c):
        turn.build(range(turn.own_len), SystemPrompts().ids)
    pool.ended(c.conversation, [1], 4)
    pool.ended(a.conversation, [1], 4)
    assert next_turn(mix, rng, pool).conversation is a.conversation  # the oldest first, not the first answered
    assert next_turn(mix, rng, pool).conversation is c.conversation
    assert next_turn(mix, rng, pool).conversation not in (a.conversation, b.conversation, c.conversation)
    pool.ended(b.conversation, [1], 4)
    one_turn = PromptMix(prompt_tokens=20, conversation_turns=1)  # the lever came down: b is over
    assert next_turn(one_turn, rng, pool).conversation is None
    pool.ended(b.conversation, [1], 4)
    assert next_turn(mix, rng, pool, max_prompt=1).conversation is not b.conversation  # past the context: a new one


def test_token_runs_are_their_ids_to_the_engine_the_router_and_the_block_manager() -> None:
    runs = TokenRuns([compact_system_ids(40), [7, 7, 7], range(500, 530)])
    ids = list(runs)
    assert len(runs) == len(ids) == 73 and runs == ids and runs[41] == 7 and runs[-1] == 529
    assert runs[30:50] == ids[30:50] and runs[:-1] == ids[:-1] and runs[72:] == [529]
    assert checked_prompt_ids(runs, 49152) is runs  # kept compact: a big fleet queues thousands
    with pytest.raises(InvalidParamError):
        checked_prompt_ids(TokenRuns([range(10), [50_000]]), 49152)
    assert prefix_keys(runs, 16) == prefix_keys(ids, 16)

    def hashes(prompt: list[int] | TokenRuns) -> list[bytes]:
        seq = Sequence("r", prompt, SamplingParams(max_tokens=1), RequestTimes(0.0))
        BlockManager(64, 16).find_cached_prefix(seq)
        return seq.block_hashes

    assert hashes(runs) == hashes(ids) and len(hashes(ids)) == 4  # equal tokens, equal blocks, whatever holds them


def test_a_simulated_carrier_keeps_its_prompt_compact() -> None:
    requests = make_workload(4000, 10.0, 6000, 100, 0.5, seed=0, system_prompt_tokens=4000, system_prompt_share=0.5)
    carriers = [r for r in requests if r.system_len]
    assert len(carriers) / len(requests) == pytest.approx(0.5, abs=0.03)
    prompts = [r.token_ids(128256) for r in carriers[:200]]
    assert all(isinstance(p, TokenRuns) and len(p.parts) == 2 for p in prompts)  # two runs, never a 6,000-id list
    assert all(p.parts[0] == compact_system_ids(4000) for p in prompts)
    first, second = prompts[0], prompts[1]
    assert first[:4000] == second[:4000] and first[4000:4016] != second[4000:4016]
    plain = next(r for r in requests if not r.system_len).token_ids(128256)
    assert isinstance(plain, range) and plain[:16] != list(compact_system_ids(16))
    assert SimRequest("1", 0.0, 4100, 8, 4000).own_ids(128256) == SimRequest("1", 0.0, 100, 8).own_ids(128256)
