"""The point-to-point programme of a pipelined replica's ranks: which op each rank posts, to
which peer, on which process group, and in which order. No torch: engine/parallel/collectives.py
(StageLink) posts exactly these ops, and tests/test_p2p_programme.py runs every rank's
programme() in a worst-case rendezvous simulator.

Two process groups carry the pipeline, one a direction:

  forward  the residual stream from stage s to stage s + 1 (TP rank t to TP rank t)
  back     the last stage's output (the sampled rows' logits, or every token's residual
           stream) from its TP rank 0 to rank 0

Why two. NCCL runs one communicator's ops on one stream, in the order a rank posted them, and a
send too big for NCCL's buffers waits (rendezvous) until the peer's matching receive runs. torch
puts unbatched isend/irecv on one communicator per rank pair, and batch_isend_irecv's on the
group's communicator. With overlap rank 0 posts send(h[N+1]) before recv(l[N]), while the last
stage posts send(l[N]) before recv(h[N+1]): on one communicator (pp = 2: the pair (0, tp) carries
both directions) each send waits for a receive queued behind the other's send, and the replica
deadlocks once a message outgrows the buffers. With a communicator a direction, every rank posts
each one's ops in batch order: stage s's sends wait only for stage s + 1's receives, and rank 0's
receives from the last stage never sit in front of its sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal["send", "recv"]
Direction = Literal["forward", "back"]
Event = Literal["launch", "collect"]  # rank 0 hands a batch to the pipeline, or takes one back


@dataclass(frozen=True)
class P2P:
    """One point-to-point op as a rank posts it: peer is the other end's (global) rank."""

    kind: Kind
    peer: int
    group: Direction


def group_ranks(tp: int, pp: int) -> dict[Direction, list[int]]:
    """Each direction's process group (every rank makes both: new_group is collective)."""
    return {"forward": list(range(tp * pp)), "back": [0, (pp - 1) * tp]}


def stage_input(rank: int, tp: int, pp: int) -> P2P | None:
    """The receive that brings a later stage's rank its input: from the same TP rank a stage back."""
    return P2P("recv", rank - tp, "forward") if rank >= tp else None


def stage_output(rank: int, tp: int, pp: int) -> P2P | None:
    """Where a rank's output goes: to the next stage's same TP rank; from the last stage, its TP
    rank 0 sends it back to rank 0 (its other TP ranks hold the same rows: nothing)."""
    if pp < 2:
        return None
    stage, tp_rank = divmod(rank, tp)
    if stage < pp - 1:
        return P2P("send", rank + tp, "forward")
    return P2P("send", 0, "back") if tp_rank == 0 else None


def returned(tp: int, pp: int) -> P2P:
    """Rank 0's receive of what the last stage sends back."""
    return P2P("recv", (pp - 1) * tp, "back")


def fullest(depth: int, batches: int) -> list[Event]:
    """Rank 0's events with the pipeline as full as it may be: launch while fewer than depth
    batches are in flight, then collect the oldest (engine/core/llm_engine.py _step_overlapped), and
    collect what is left at the end. depth 1: no overlap."""
    events: list[Event] = []
    in_flight = 0
    for _ in range(batches):
        events.append("launch")
        in_flight += 1
        if in_flight == depth:
            events.append("collect")
            in_flight -= 1
    return events + ["collect"] * in_flight


def programme(rank: int, tp: int, pp: int, events: Sequence[Event]) -> list[tuple[int, P2P]]:
    """A rank's ops in the order it posts them, each with its batch, given rank 0's events:
    every launch is a batch that each stage takes in (stage_input), works on and passes on
    (stage_output), in launch order; rank 0 alone collects (returned), oldest first."""
    ops: list[tuple[int, P2P]] = []
    launched = collected = 0
    for event in events:
        if event == "launch":
            ops += [(launched, op) for op in (stage_input(rank, tp, pp), stage_output(rank, tp, pp)) if op is not None]
            launched += 1
        else:
            if collected >= launched:
                raise ValueError("a collect with no batch in flight")
            if rank == 0:
                ops.append((collected, returned(tp, pp)))
            collected += 1
    return ops
