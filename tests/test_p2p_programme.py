"""The pipeline's point-to-point programme (engine/parallel/p2p.py) in a worst-case rendezvous simulator:
every rank's ops, as the runtime posts them, complete for every pipeline shape and every way the
engine keeps batches in flight; and the old order (unbatched isend/irecv, one communicator per
rank pair in both directions) deadlocks, as it would on NCCL once messages outgrow its buffers.

The simulator's NCCL, at its least forgiving:
  - a rank's ops on one communicator run in the order it posted them (one stream each);
    different communicators are independent streams
  - a send completes only together with the peer's matching receive, and only once that receive
    is at the head of the peer's queue on the same communicator (rendezvous: no buffering at all)
  - an op starts only after what the rank waited on before posting it: every earlier receive (its
    result feeds the work after it) and every earlier stage all-reduce, and the sends StageLink
    waited for (it keeps at most depth = pp outstanding)
  - with tensor parallelism each rank's forward holds an all-reduce over its stage's TP group,
    which completes only once every rank of the stage has it at the head of that group's queue
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import pytest

from engine.parallel.collectives import StageLink
from engine.parallel.p2p import P2P, Event, fullest, group_ranks, programme, stage_input, stage_output

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class AllReduce:
    """A stage's all-reduce inside a rank's forward (the model's, not the programme's)."""

    stage: int


Comm = Callable[[int, P2P], Hashable]


def by_group(rank: int, op: P2P) -> Hashable:
    return ("group", op.group)  # batch_isend_irecv: the op's group's communicator (the runtime)


def by_pair(rank: int, op: P2P) -> Hashable:
    return ("pair", min(rank, op.peer), max(rank, op.peer))  # unbatched isend/irecv on one group (the old wire)


def one_group(rank: int, op: P2P) -> Hashable:
    return ("group", "world")  # batched, but both directions on one group


def with_all_reduces(rank: int, tp: int, pp: int, ops: list[tuple[int, P2P]]) -> list[tuple[int, P2P | AllReduce]]:
    """The rank's programme with its forward's all-reduce in place: after its input arrives, or
    (the first stage) before its output leaves."""
    stage = rank // tp
    out: list[tuple[int, P2P | AllReduce]] = []
    for batch, op in ops:
        if tp > 1 and stage == 0 and op == stage_output(rank, tp, pp):
            out.append((batch, AllReduce(stage)))
        out.append((batch, op))
        if tp > 1 and stage > 0 and op == stage_input(rank, tp, pp):
            out.append((batch, AllReduce(stage)))
    return out


def prerequisites(ops: list[tuple[int, P2P | AllReduce]], window: int) -> list[list[int]]:
    """For each op, the earlier ops of its rank that must have completed before it starts."""
    needs: list[list[int]] = []
    sends: list[int] = []
    for i, (_, op) in enumerate(ops):
        waited = [j for j in range(i) if not (isinstance(ops[j][1], P2P) and ops[j][1].kind == "send")]
        last_waited_send = len(sends) - window if isinstance(op, P2P) and op.kind == "send" else len(sends) - 1 - window
        needs.append(waited + sends[: max(0, last_waited_send + 1)])
        if isinstance(op, P2P) and op.kind == "send":
            sends.append(i)
    return needs


def simulate(tp: int, pp: int, events: list[Event], comm: Comm) -> dict[int, int]:
    """Run every rank's programme until all is done or nothing can move; the ops each rank has left."""
    world = tp * pp
    ops = {r: with_all_reduces(r, tp, pp, programme(r, tp, pp, events)) for r in range(world)}
    needs = {r: prerequisites(ops[r], window=pp) for r in range(world)}
    done = {r: [False] * len(ops[r]) for r in range(world)}
    queues: dict[tuple[int, Hashable], deque[int]] = {}
    for r in range(world):
        for i, (_, op) in enumerate(ops[r]):
            key = ("stage", op.stage) if isinstance(op, AllReduce) else comm(r, op)
            queues.setdefault((r, key), deque()).append(i)

    def head(r: int, key: Hashable) -> int | None:
        q = queues.get((r, key))
        return q[0] if q and all(done[r][j] for j in needs[r][q[0]]) else None

    def finish(r: int, key: Hashable) -> None:
        done[r][queues[(r, key)].popleft()] = True

    moved = True
    while moved:
        moved = False
        for r, key in list(queues):
            i = head(r, key)
            if i is None:
                continue
            batch, op = ops[r][i]
            if isinstance(op, AllReduce):
                members = range(op.stage * tp, (op.stage + 1) * tp)
                heads = [head(m, key) for m in members]
                if all(h is not None for h in heads):
                    assert all(ops[m][h][0] == batch for m, h in zip(members, heads))  # type: ignore[index]
                    for m in members:
                        finish(m, key)
                    moved = True
            elif op.kind == "send":
                j = head(op.peer, key)
                if j is not None and ops[op.peer][j][1] == P2P("recv", r, op.group):
                    assert ops[op.peer][j][0] == batch, "a receive took another batch's message"
                    finish(r, key)
                    finish(op.peer, key)
                    moved = True
    return {r: done[r].count(False) for r in range(world) if not all(done[r])}


SHAPES = [(tp, pp) for pp in (2, 3, 4) for tp in (1, 2)]


@pytest.mark.parametrize("tp,pp", SHAPES)
def test_every_rank_finishes_with_up_to_pp_batches_in_flight(tp: int, pp: int) -> None:
    for depth in range(1, pp + 1):
        assert simulate(tp, pp, fullest(depth, batches=3 * pp), by_group) == {}, f"depth {depth}"


@pytest.mark.parametrize("tp,pp", SHAPES)
def test_every_rank_finishes_whatever_the_engine_launches_and_collects_when(tp: int, pp: int) -> None:
    rng = random.Random(44 + 10 * tp + pp)
    for _ in range(30):
        events: list[Event] = []
        launched = in_flight = 0
        while launched < 8 or in_flight:  # any order the engine may take, at most pp in flight
            if launched < 8 and in_flight < pp and (in_flight == 0 or rng.random() < 0.6):
                events.append("launch")
                launched, in_flight = launched + 1, in_flight + 1
            else:
                events.append("collect")
                in_flight -= 1
        assert simulate(tp, pp, events, by_group) == {}, events


@pytest.mark.parametrize("tp", [1, 2])
def test_the_old_wire_deadlocks_two_stages_once_batches_overlap(tp: int) -> None:
    """Unbatched isend/irecv: the pair (0, tp) is one communicator both ways."""
    stuck = simulate(tp, 2, fullest(2, batches=4), by_pair)
    assert 0 in stuck and tp in stuck
    assert simulate(tp, 2, fullest(1, batches=4), by_pair) == {}  # one batch at a time: no cycle


@pytest.mark.parametrize("tp,pp", SHAPES)
def test_one_group_for_both_directions_deadlocks_too(tp: int, pp: int) -> None:
    """Batching alone is not the fix: on one group's communicator rank 0's next send still queues
    in front of the receive the last stage is waiting to send into."""
    assert simulate(tp, pp, fullest(pp, batches=2 * pp), one_group) != {}


@pytest.mark.parametrize("tp,pp", SHAPES)
def test_the_runtime_posts_the_programme(tp: int, pp: int) -> None:
    """StageLink's ops are the programme's, each on a group its rank belongs to, and every send
    has its receive at the other end."""
    members = group_ranks(tp, pp)
    posted: list[tuple[int, P2P]] = []
    for rank in range(tp * pp):
        link = StageLink(rank, tp, pp, {}, pp)
        ops = [op for _, op in programme(rank, tp, pp, ["launch", "collect"])]
        ends = [link.give, link.take] if rank == 0 else [link.take, link.give]
        assert ops == [op for op in ends if op is not None]
        assert all(rank in members[op.group] and op.peer in members[op.group] for op in ops)
        posted += [(rank, op) for op in ops]
    sends = sorted((r, op.peer, op.group) for r, op in posted if op.kind == "send")
    recvs = sorted((op.peer, r, op.group) for r, op in posted if op.kind == "recv")
    assert sends == recvs
