"""A replica's own process: load the engine, then loop (take commands, step, report one
StepMessage a step or a heartbeat when idle); a heartbeat thread keeps talking during long steps.
engine/serving/replicas/replica.py's ReplicaHandle is the front process's side of it."""

from __future__ import annotations

import gc
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from engine.clock import WALL_CLOCK
from engine.config import EngineConfig
from engine.core.sequence import FinishReason
from engine.platform.machine import set_affinity
from engine.serving.replicas.messages import (
    AbortRequest,
    AddRequest,
    Drain,
    Heartbeat,
    Reconfigure,
    ReplicaFailure,
    RequestError,
    StepMessage,
    Stop,
    expired_error,
)
from engine.serving.replicas.replica_api import ReplicaState, ReplicaStats


def replica_main(
    replica_id: int, config: EngineConfig, inbox: Any, outbox: Any, cores: list[int] | None, heartbeat_s: float
) -> None:
    """The child process: load the engine, then loop: take commands, step, report."""
    from engine.core.llm_engine import LLMEngine
    from engine.core.memory import copy_bandwidth_gbs
    from engine.errors import InvalidParamError
    from engine.parallel.distributed import ShardGroupError, world_size
    from engine.platform.machine import resolve_device
    from engine.serving.replicas.replica_requests import ReplicaRequests
    from engine.worker.warm_up import warm_up

    clock = WALL_CLOCK
    if cores:
        set_affinity(cores)  # Linux pins; macOS has no affinity call, only the thread count holds
        config = config.replace(num_threads=len(cores))
    outbox.put(StepMessage(replica_id, clock.now(), state=ReplicaState.STARTING))
    try:
        # On CUDA, replica i's ranks take the cards from base + i * ranks (engine/platform/machine.py).
        config = config.replace(device=resolve_device(config.device, replica_id, world_size(config)))
        engine = LLMEngine(config)
        warm_up(engine)
    except Exception as exc:  # noqa: BLE001 - any load failure makes this replica failed
        failure = ReplicaFailure.of_load_error(exc)
        outbox.put(StepMessage(replica_id, clock.now(), state=ReplicaState.FAILED, failure=failure))
        return
    engine.replica_id = replica_id
    # The loaded engine (torch's modules, the model) lives as long as the process: frozen, the
    # collector's full passes skip its 220k objects (0.08 s a pass here) instead of landing in a step.
    gc.collect()
    gc.freeze()
    state = ReplicaState.READY
    bandwidth = copy_bandwidth_gbs(engine.config.device)
    requests = ReplicaRequests(engine)

    def stats() -> ReplicaStats:
        # Typed here, in the replica's own process: the pipe carries the record, not a dict.
        return ReplicaStats.of_engine(
            engine.stats(), max_num_seqs=engine.config.max_num_seqs, pid=os.getpid(), copy_gbs=bandwidth
        )

    outbox.put(StepMessage(replica_id, clock.now(), stats=stats(), state=state, plan=engine.plan))
    last_sent = clock.now()
    progress: dict[str, float | None] = {"step_started": None}
    threading.Thread(
        target=_heartbeats, args=(replica_id, outbox, progress, heartbeat_s), name="heartbeat", daemon=True
    ).start()
    while True:
        commands = _take_commands(inbox, wait=0 if engine.has_work() else heartbeat_s)
        errors: list[RequestError] = []
        for cmd in commands:
            if isinstance(cmd, AddRequest):
                if state != ReplicaState.READY:
                    errors.append(RequestError(cmd.request_id, None, f"replica {replica_id} is {state}"))
                    continue
                try:
                    requests.add(cmd)
                except InvalidParamError as err:
                    errors.append(RequestError(cmd.request_id, err.param, err.message))
                except FileNotFoundError:  # its KV was freed on the way (the front gave up on it)
                    errors.append(RequestError(cmd.request_id, None, "the handed-off KV blocks were gone"))
            elif isinstance(cmd, AbortRequest):
                engine.abort(cmd.request_id)
            elif isinstance(cmd, Reconfigure):
                engine.reconfigure(**cmd.changes)
            elif isinstance(cmd, Drain):
                state = ReplicaState.DRAINING
            elif isinstance(cmd, Stop):
                engine.close()
                errors += [RequestError(rid, None, "replica stopped") for rid in engine.requests]
                outbox.put(StepMessage(replica_id, clock.now(), errors=errors, stats=stats(), state=ReplicaState.STOPPED))
                return
        deltas = []
        if engine.has_work():
            progress["step_started"] = clock.now()
            try:
                outputs = engine.step()
                deltas = [requests.delta(out) for out in outputs if out.finish_reason != FinishReason.DEADLINE]
                errors += [expired_error(out.request_id) for out in outputs if out.finish_reason == FinishReason.DEADLINE]
            except ShardGroupError as exc:  # a tensor-parallel rank hung or died: the group is gone
                errors += [RequestError(rid, None, str(exc)) for rid in engine.requests]
                failure = ReplicaFailure(str(exc), permanent=False)  # a fresh group may well hold
                outbox.put(StepMessage(replica_id, clock.now(), errors=errors, state=ReplicaState.FAILED, failure=failure))
                return
            progress["step_started"] = None
        if state == ReplicaState.DRAINING and not engine.has_work():
            engine.close()
            steps = engine.step_records.take() if engine.step_records is not None else []
            outbox.put(StepMessage(replica_id, clock.now(), deltas, errors, stats(), ReplicaState.STOPPED, steps))
            return
        now = clock.now()
        if deltas or errors or now - last_sent >= heartbeat_s:
            steps = engine.step_records.take() if engine.step_records is not None else []
            outbox.put(StepMessage(replica_id, now, deltas, errors, stats(), state, steps))
            last_sent = now


def replica_pids(server_pid: int) -> list[int]:
    """The replica processes a server spawned (its children running multiprocessing's spawn_main),
    read from /proc: for tests and benchmarks that signal or measure them."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if ppid == server_pid and b"spawn_main" in cmdline:
            pids.append(int(entry.name))
    return pids


def _heartbeats(replica_id: int, outbox: Any, progress: dict[str, float | None], every_s: float) -> None:
    while True:
        outbox.put(Heartbeat(replica_id, WALL_CLOCK.now(), progress["step_started"]))
        time.sleep(every_s)


def _take_commands(inbox: Any, wait: float) -> list[Any]:
    commands = []
    try:
        commands.append(inbox.get(timeout=wait) if wait > 0 else inbox.get_nowait())
        while True:
            commands.append(inbox.get_nowait())
    except queue.Empty:
        pass
    return commands
