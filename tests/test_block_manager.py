"""Property tests of the block manager: random interleavings of admit, grow, compute, free."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.clock import VirtualClock
from engine.core.block_manager import BlockManager
from engine.core.sequence import RequestTimes, Sequence
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

BLOCK_SIZE = 4
NUM_BLOCKS = 24


def make_seq(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(max_tokens=8), RequestTimes(arrival=VirtualClock().now()))


# Few distinct tokens so prompts share prefixes often.
prompts = st.lists(st.integers(0, 2), min_size=1, max_size=20)


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
        self.live: list[Sequence] = []
        self.count = 0

    @rule(tokens=prompts)
    def admit(self, tokens: list[int]) -> None:
        seq = make_seq(f"r{self.count}", tokens)
        self.count += 1
        prefix = self.bm.find_cached_prefix(seq)
        for i, block_id in enumerate(prefix):  # reused only when the tokens match
            assert self.bm.tokens[block_id] == tuple(tokens[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
        assert len(prefix) * BLOCK_SIZE < len(tokens)
        remaining = len(tokens) - len(prefix) * BLOCK_SIZE
        if not self.bm.can_admit(prefix, remaining):
            return
        free_before = self.bm.num_free_blocks
        self.bm.admit(seq, prefix)
        assert self.bm.allocate(seq, remaining)
        assert self.bm.num_free_blocks <= free_before
        seq.num_computed_tokens = len(tokens)
        self.bm.cache_full_blocks(seq)
        self.live.append(seq)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 100), token=st.integers(0, 2))
    def decode(self, index: int, token: int) -> None:
        seq = self.live[index % len(self.live)]
        seq.output_token_ids.append(token)
        if self.bm.allocate(seq, 1):
            seq.num_computed_tokens += 1
            self.bm.cache_full_blocks(seq)
        else:
            seq.output_token_ids.pop()

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 100))
    def finish_or_abort(self, index: int) -> None:
        seq = self.live.pop(index % len(self.live))
        self.bm.free(seq)
        assert seq.block_table == []

    @invariant()
    def ownership_is_consistent(self) -> None:
        owners: dict[int, int] = {}
        for seq in self.live:
            for block_id in seq.block_table:
                owners[block_id] = owners.get(block_id, 0) + 1
        for block_id, ref_count in enumerate(self.bm.ref_counts):
            assert ref_count >= 0
            assert ref_count == owners.get(block_id, 0)
            is_free = block_id in self.bm.free_cached or block_id in self.bm.empty
            assert is_free == (ref_count == 0), "a block is both free and owned (or neither)"
        for block_hash, block_id in self.bm.cached.items():
            assert self.bm.hashes[block_id] == block_hash

    def teardown(self) -> None:
        for seq in self.live:
            self.bm.free(seq)
        assert self.bm.num_free_blocks == NUM_BLOCKS
        assert all(r == 0 for r in self.bm.ref_counts)


TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_prefix_hit_shares_blocks_and_counts_tokens() -> None:
    bm = BlockManager(16, BLOCK_SIZE)
    a = make_seq("a", list(range(10)))
    bm.admit(a, bm.find_cached_prefix(a))
    assert bm.allocate(a, 10)
    a.num_computed_tokens = 10
    bm.cache_full_blocks(a)
    b = make_seq("b", list(range(9)) + [99])
    prefix = bm.find_cached_prefix(b)
    assert prefix == a.block_table[:2]  # two full blocks of 4 match; the third differs
    bm.admit(b, prefix)
    assert b.num_computed_tokens == 8 and b.num_cached_tokens == 8
    assert all(bm.ref_counts[i] == 2 for i in prefix)
    assert bm.prefix_hits == 8 and bm.prefix_queries == 20


def test_evicts_least_recently_freed_cached_block() -> None:
    bm = BlockManager(2, BLOCK_SIZE)
    a = make_seq("a", [1, 2, 3, 4, 5])
    bm.admit(a, [])
    assert bm.allocate(a, 5)
    a.num_computed_tokens = 5
    bm.cache_full_blocks(a)
    bm.free(a)
    assert len(bm.cached) == 1  # the full block stays cached while free
    c = make_seq("c", [9, 9, 9, 9, 9, 9, 9])
    bm.admit(c, [])
    assert bm.allocate(c, 7)  # needs both blocks: the cached one is evicted
    assert bm.cached == {}


def test_imported_prefix_is_found_like_a_cache_hit() -> None:
    """Disaggregated decode: the prompt's KV arrives from a prefill replica; admission then finds
    every full block cached and computes only what is left."""
    from engine.core.sequence import RequestTimes, Sequence
    from engine.sampling_params import SamplingParams

    kv = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(10, 23))  # 13 tokens: 3 full blocks + 1
    assert len(kv.import_prefix(prompt)) == 3
    assert kv.num_free_blocks == 8  # imported blocks are free (evictable) until a sequence holds them
    seq = Sequence("r", prompt + [99], SamplingParams(max_tokens=4), RequestTimes(arrival=0.0))
    prefix = kv.find_cached_prefix(seq)
    assert len(prefix) == 3
    kv.admit(seq, prefix)
    assert seq.num_computed_tokens == 12 and kv.num_free_blocks == 5


def test_an_import_short_of_room_keeps_its_head_and_stops() -> None:
    """Imported blocks are free (cached) as they land: with room for two, the third must not evict
    the first (the chain would then be found from nowhere)."""
    kv = BlockManager(num_blocks=4, block_size=4)
    holder = make_seq("held", list(range(100, 108)))
    kv.admit(holder, [])
    assert kv.allocate(holder, 8)  # two of the four blocks held
    placed = kv.import_prefix(list(range(10, 26)))  # four full blocks offered, room for two
    assert [i for i, _ in placed] == [0, 1]
    seq = make_seq("r", list(range(10, 27)))
    assert len(kv.find_cached_prefix(seq)) == 2
