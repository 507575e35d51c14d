"""The router's memory of which prompt blocks it sent to each replica (prefix-aware routing): most
recently sent last, bounded, and a full fleet answered before any prompt is hashed. Kept by prompt
while prompts share nothing and by key after, it answers as one OrderedDict of keys would."""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass

import pytest

from engine.clock import VirtualClock
from engine.sampling_params import SamplingParams
from engine.serving.replicas.replica_api import ReplicaState
from engine.serving.routing import router as router_module
from engine.serving.routing.prefix_memory import PrefixMemory, PromptBlocks, prefix_keys
from engine.serving.routing.request_queue import QueuedRequest
from engine.serving.routing.router import Router, RouterConfig

pytestmark = pytest.mark.unit

BS = 4
PARAMS = SamplingParams(max_tokens=4)


@dataclass
class Stats:
    max_num_seqs: int = 8
    waiting: int = 0
    free_blocks: int = 1000


@dataclass
class FakeReplica:
    """What the router reads of a replica: its id, state, stats and requests in flight."""

    replica_id: int
    state: ReplicaState = ReplicaState.READY
    stats: Stats | None = None
    num_in_flight: int = 0


def request(ids: list[int]) -> QueuedRequest:
    return QueuedRequest("r", ids, PARAMS)


def router(replicas: list[FakeReplica]) -> Router:
    config = RouterConfig(queue_cap=8, deadline_s=None, block_size=BS)
    return Router(replicas, config, VirtualClock(), dispatch_thread=False)  # type: ignore[arg-type]


def test_sent_blocks_are_remembered_most_recent_last_and_a_shared_head_moves_up() -> None:
    replica = FakeReplica(0, stats=Stats())
    rt = router([replica])
    first, second = list(range(12)), list(range(8)) + [90, 91, 92, 93]
    rt._remember_prefix(replica, request(first))  # type: ignore[arg-type]
    a = prefix_keys(first, BS)
    assert list(rt._prefixes[0]) == a
    rt._remember_prefix(replica, request(second))  # type: ignore[arg-type]
    b = prefix_keys(second, BS)
    assert b[:2] == a[:2] and b[2] != a[2]
    # The shared head moved to the recent end, in prompt order, after the block only `first` had.
    assert list(rt._prefixes[0]) == [a[2], *b]


def test_the_memory_forgets_the_oldest_blocks_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(router_module, "PREFIX_MEMORY", 5)
    replica = FakeReplica(0, stats=Stats())
    rt = router([replica])
    first, second = list(range(12)), list(range(100, 116))
    rt._remember_prefix(replica, request(first))  # type: ignore[arg-type]
    rt._remember_prefix(replica, request(second))  # type: ignore[arg-type]
    assert list(rt._prefixes[0]) == [prefix_keys(first, BS)[-1], *prefix_keys(second, BS)]


def test_the_replica_holding_the_longest_head_wins_and_a_full_fleet_hashes_nothing() -> None:
    a, b = FakeReplica(0, stats=Stats()), FakeReplica(1, stats=Stats())
    rt = router([a, b])
    rt._remember_prefix(b, request(list(range(12))))  # type: ignore[arg-type]
    assert rt._pick(request(list(range(8)) + [50, 51, 52, 53])) is b
    a.num_in_flight = b.num_in_flight = 8  # both full
    full = request(list(range(12)))
    assert rt._pick(full) is None
    assert full.blocks is None  # answered from the replicas' room alone


class ReferenceMemory:
    """The memory as the router kept it before (an OrderedDict of keys), to compare against."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.known = capacity, OrderedDict[int, None]()

    def remember(self, keys: list[int]) -> None:
        if not self.known.keys().isdisjoint(keys):
            for key in keys:
                self.known.pop(key, None)
        self.known.update(dict.fromkeys(keys))
        while len(self.known) > self.capacity:
            self.known.popitem(last=False)

    def leading(self, keys: list[int]) -> int:
        n = 0
        for key in keys:
            if key not in self.known:
                break
            n += 1
        return n


@pytest.mark.parametrize("capacity", [3, 40, 400])
@pytest.mark.parametrize("share", [0.0, 0.05, 0.5])
def test_the_memory_answers_as_an_ordered_dict_of_keys(capacity: int, share: float) -> None:
    """Distinct prompts (kept by prompt), then some sharing heads or sent again (by key from the
    first that may share): the same keys in the same order, and the same cached heads."""
    rng = random.Random(capacity * 7 + int(share * 100))
    sent: list[list[int]] = []
    memory, reference = PrefixMemory(capacity), ReferenceMemory(capacity)
    for i in range(600):
        if sent and rng.random() < share:  # a head (or all) of an earlier prompt, then its own part
            base = rng.choice(sent[-50:])
            ids = base[: rng.randint(0, len(base))] + [10_000 + i] * rng.randint(0, 9)
        else:
            ids = list(range(100 * i, 100 * i + rng.randint(0, 30)))  # some under one block
        sent.append(ids)
        probe = PromptBlocks(ids, BS)
        assert memory.leading(probe) == reference.leading(prefix_keys(ids, BS))
        memory.remember(PromptBlocks(ids, BS))
        reference.remember(prefix_keys(ids, BS))
        assert len(memory) == len(reference.known)
        if i % 25 == 0 or i > 590:
            assert list(memory) == list(reference.known)
    if share == 0.0:
        assert memory._last is None  # never left the by-prompt form
    elif capacity > 3:  # a shared head came while its prompt was remembered
        assert memory._last is not None


def test_a_prompt_is_hashed_past_its_first_block_only_when_that_decides() -> None:
    memory = PrefixMemory(100)
    first = PromptBlocks(list(range(40)), BS)
    memory.remember(first)
    other = PromptBlocks(list(range(500, 540)), BS)
    assert memory.leading(other) == 0
    memory.remember(other)
    assert first._keys is None and other._keys is None  # distinct prompts: one key each
    again = PromptBlocks(list(range(20)) + [7] * 8, BS)
    assert memory.leading(again) == 5  # shares first's five blocks: now the keys are compared
