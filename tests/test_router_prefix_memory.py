"""The router's memory of which prompt blocks it sent to each replica (prefix-aware routing): most
recently sent last, bounded, and a full fleet answered before any prompt is hashed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from engine.clock import VirtualClock
from engine.sampling_params import SamplingParams
from engine.serving.replicas.replica_api import ReplicaState
from engine.serving.routing import router as router_module
from engine.serving.routing.request_queue import QueuedRequest
from engine.serving.routing.router import Router, RouterConfig, prefix_keys

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
    assert full.block_hashes is None  # answered from the replicas' room alone
