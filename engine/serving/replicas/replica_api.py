"""The replica contract the router and fleet drive, whichever kind: a live replica process
(ReplicaHandle) or a simulated one (engine/sim/replica.py)."""

from __future__ import annotations

import enum
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.serving.replicas.messages import AddRequest


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


@dataclass(frozen=True)
class ReplicaStats:
    """A replica's latest step, as the router and autoscaler read it; `facts` keeps the rest of
    what the engine reports (weights, KV budget, bandwidth, tensor-parallel figures)."""

    running: int = 0
    waiting: int = 0
    kv_used_blocks: int = 0
    kv_total_blocks: int = 0
    max_num_seqs: int = 0
    num_preemptions: int = 0
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def free_blocks(self) -> int:
        return self.kv_total_blocks - self.kv_used_blocks

    @classmethod
    def from_dict(cls, stats: dict[str, Any]) -> ReplicaStats:
        return cls(
            stats.get("running", 0), stats.get("waiting", 0), stats.get("kv_used_blocks", 0),
            stats.get("kv_total_blocks", 0), stats.get("max_num_seqs", 0), stats.get("num_preemptions", 0), stats,
        )


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
