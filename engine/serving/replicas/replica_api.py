"""The replica contract the router and fleet drive, whichever kind: a live replica process
(ReplicaHandle) or a simulated one (engine/sim/replica.py). Its stats are ReplicaStats, the
typed record a replica's StepMessage carries (messages.py)."""

from __future__ import annotations

import enum
import queue
from collections.abc import Callable
from typing import Any, Protocol

# ReplicaStats is the pipe's record (messages.py): the router reads what the replica sent.
from engine.serving.replicas.messages import AddRequest, ReplicaStats


class ReplicaState(enum.StrEnum):
    """StrEnum: members equal their strings, so messages, JSON and the pages read the same."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


ENDED = (ReplicaState.STOPPED, ReplicaState.FAILED)
SERVING = (ReplicaState.STARTING, ReplicaState.READY)  # capacity: loaded, or loading to serve


class PoolState(enum.StrEnum):
    """How the fleet counts what is not (yet) a serving replica, beside ReplicaState's names in
    Fleet.replica_states(): a warm pool replica loaded or still coming, a serving order waiting
    for its machine."""

    WARM = "warm"
    WARMING = "warming"
    PROVISIONING = "provisioning"


class Replica(Protocol):
    replica_id: int
    state: ReplicaState
    stats: ReplicaStats | None  # None until its first step reports
    error: str | None

    @property
    def num_in_flight(self) -> int: ...

    def submit(self, request: AddRequest, events: queue.Queue | None = None) -> queue.Queue: ...

    def abort(self, request_id: str) -> None: ...

    def reconfigure(self, **changes: Any) -> None: ...

    def drain(self) -> None: ...

    def kill(self, reason: str) -> int: ...  # stop now, failing residents; returns those mid-stream

    def stop(self) -> None: ...


# Fleet's seam: (replica_id, engine config, cores=..., on_message=...) -> a replica of either kind.
ReplicaFactory = Callable[..., Any]
