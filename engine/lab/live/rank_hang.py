"""Hang a rank from the page (the failure gallery's `collective_timeout` row, issue 26): SIGSTOP
one non-zero rank of a ready tensor-parallel replica of the live fleet, and SIGCONT it again.

What follows depends on the replica's defence lever `collective_timeout` (an EngineConfig field,
so the group's own, engine/parallel/distributed.py): on, rank 0's all-reduce times out (or the step
watchdog fires first), the group fails loudly (every rank SIGKILLed, the stopped one too), and
the autoscaler orders a fresh one; off, rank 0 waits inside the all-reduce while its heartbeats
still say ready, and tokens/s falls to 0 until the rank is resumed. Either shows only while a
request is running. At most one rank is stopped at a time, and none is left stopped: the lab
calls release() before it rebuilds its replicas, switches executor, or stops."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import ServingError
from engine.lab.facade import RankHangAction, RankHangAnswer
from engine.parallel.ranks import COLLECTIVE_TIMEOUT_S, STEP_TIMEOUT_S
from engine.serving.replicas.replica_api import ReplicaState
from engine.serving.telemetry.events import EventLog

RANK = 1  # the rank stopped: the first of the spawned ones (rank 0 is the replica's own process)


def is_rank(pid: int, parent: int) -> bool:
    """That process is still there, not a zombie, and still the child of rank 0 (so not a
    recycled pid): /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
    except OSError:
        return False
    return state not in ("Z", "X") and int(ppid) == parent


@dataclass(frozen=True)
class StoppedRank:
    """The rank this lab stopped: which replica, which process, and whether the replica's
    collective_timeout was on then (what the learner was told to watch for)."""

    replica_id: int
    pid: int
    parent: int  # rank 0's pid: the replica's own process, which spawned this rank
    guarded: bool

    @property
    def name(self) -> str:
        return f"rank {RANK} of replica {self.replica_id} (pid {self.pid})"


class RankHang:
    def __init__(self, replicas: Callable[[], list[Any]], events: EventLog) -> None:
        """replicas(): the fleet's serving replicas, of the moment; events: where it says what it did."""
        self.replicas = replicas
        self.events = events
        self.stopped: StoppedRank | None = None
        self._lock = threading.Lock()

    def act(self, action: object, traffic_on: bool = True) -> RankHangAnswer:
        """The action (a RankHangAction, or its word): what it did, for the page, or ServingError /
        InvalidParamError naming the field to change."""
        if RankHangAction.parse(action) is RankHangAction.STOP:
            return self.stop(traffic_on)
        return self.resume()

    def stop(self, traffic_on: bool = True) -> RankHangAnswer:
        with self._lock:
            held = self.stopped
            if held is not None and is_rank(held.pid, held.parent):
                raise ServingError(409, f"{held.name} is already stopped: resume it first", "action", "already_stopped")
            self.stopped = None  # its group was killed by the defence since: nothing to resume
            replica, pids = self._target()
            guarded = bool(getattr(replica.config, "collective_timeout", True))
            os.kill(pids[RANK], signal.SIGSTOP)
            held = self.stopped = StoppedRank(replica.replica_id, pids[RANK], pids[0], guarded)
        if guarded:
            watch = (
                f"collective_timeout is on: within {COLLECTIVE_TIMEOUT_S:.0f} to {STEP_TIMEOUT_S:.0f} s rank 0's "
                "all-reduce times out, the group fails loudly (the replica shows failed) and a fresh one is ordered"
            )
        else:
            watch = (
                "collective_timeout is off: rank 0 waits inside its all-reduce for good, no token comes and "
                "tokens_per_s falls to 0 over its window while the replica still shows ready, until you resume it"
            )
        hint = "" if traffic_on else " Traffic is off: start it, since only a running request shows the hang."
        message = f"{held.name} stopped (SIGSTOP). {watch}.{hint}"
        self.events.emit("replica", message, replica=held.replica_id)
        return RankHangAnswer(message, stopped=True, replica=held.replica_id, pid=held.pid, guarded=guarded)

    def resume(self) -> RankHangAnswer:
        with self._lock:
            held, self.stopped = self.stopped, None
            if held is None:
                raise ServingError(409, "no rank is stopped: stop one first", "action", "not_stopped")
            resumed = self._continue(held)
        if resumed:
            message = f"{held.name} resumed (SIGCONT): its all-reduces complete and tokens flow again"
        else:
            message = (
                f"{held.name} is gone already: collective_timeout killed its group, the replica was marked "
                "failed and replaced; nothing to resume"
            )
        self.events.emit("replica", message, replica=held.replica_id)
        return RankHangAnswer(message, stopped=False, replica=held.replica_id, pid=held.pid, resumed=resumed)

    def release(self, why: str) -> None:
        """Before the lab rebuilds, switches executor or stops: a rank still stopped is resumed."""
        with self._lock:
            held, self.stopped = self.stopped, None
            if held is None or not self._continue(held):
                return
        self.events.emit("replica", f"{held.name} resumed (SIGCONT): {why}", replica=held.replica_id)

    def _target(self) -> tuple[Any, list[int]]:
        """The first ready replica with more than one rank, and its ranks' pids (rank 0 first)."""
        grouped = False
        for replica in list(self.replicas()):
            ranks = getattr(replica.config, "tensor_parallel", 1) * getattr(replica.config, "pipeline_parallel", 1)
            if ranks < 2:
                continue
            grouped = True
            pids = list(replica.stats.rank_pids) if replica.stats is not None else []
            if replica.state == ReplicaState.READY and len(pids) > RANK and is_rank(pids[RANK], pids[0]):
                return replica, pids
        if grouped:
            message = "the sharded replica is not ready yet: try again once it serves"
        else:
            message = (
                "no replica has more than one rank: set tensor_parallel or pipeline_parallel to 2 first "
                "(a rank is one of its processes)"
            )
        raise ServingError(409, message, "tensor_parallel", "no_tensor_parallel")

    @staticmethod
    def _continue(held: StoppedRank) -> bool:
        """SIGCONT it while it is still there (a signal lands a moment after it is sent, so its
        state may not read T yet; a running process ignores SIGCONT); False if its group is gone."""
        if not is_rank(held.pid, held.parent):
            return False
        try:
            os.kill(held.pid, signal.SIGCONT)
        except ProcessLookupError:
            return False
        return True
