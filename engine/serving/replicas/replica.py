"""A replica is one engine in its own process (multiprocessing spawn), on the cores it owns.

The child (engine/serving/replicas/replica_process.py) runs the engine's step loop and sends one StepMessage per step (every new token of
every request on it) or, when idle, a heartbeat. The parent's ReplicaHandle turns those into
per-request event queues, and notices a replica that died (its process sentinel) or got stuck
(no heartbeat for heartbeat_timeout_s, or one step running past step_timeout_s), failing its
in-flight requests with an error. A heartbeat thread in the child keeps talking during long steps,
so a slow step on a busy CPU is not mistaken for a frozen process."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import queue
import threading
from collections.abc import Callable
from typing import Any

from engine.clock import WALL_CLOCK
from engine.config import EngineConfig
from engine.core.kv_segment import SharedKV
from engine.parallel.ranks import STEP_TIMEOUT_S
from engine.platform.machine import EnginePlan
from engine.serving.replicas.messages import (
    AbortRequest,
    AddRequest,
    Drain,
    Heartbeat,
    Reconfigure,
    RequestError,
    StepMessage,
    Stop,
    TokenDelta,
)
from engine.serving.replicas.replica_api import ENDED, ReplicaState, ReplicaStats
from engine.serving.replicas.replica_process import replica_main

log = logging.getLogger("servelab.replica")

STATES = tuple(ReplicaState)


class ReplicaHandle:
    """The front process's view of one replica: submit, abort, drain, and its latest stats."""

    def __init__(
        self,
        replica_id: int,
        config: EngineConfig,
        cores: list[int] | None = None,
        heartbeat_s: float = 0.25,
        heartbeat_timeout_s: float = 2.0,
        step_timeout_s: float = 30.0,
        on_message: Callable[[StepMessage], None] | None = None,
        on_handoff: Callable[[AddRequest, TokenDelta, queue.Queue], None] | None = None,
    ) -> None:
        """on_handoff: this is a prefill replica of a prefill/decode split: each request (that
        asks for more than one token) makes its first token here, then on_handoff(the request,
        the delta carrying its KV, its event queue) sends it on to decode."""
        ctx = mp.get_context("spawn")
        self.on_message = on_message  # the metrics bus listens here
        self.replica_id = replica_id
        self.config = config
        self.heartbeat_timeout_s = heartbeat_timeout_s
        # A sharded replica (TP ranks, pipeline stages) is one failure unit: a rank that hangs holds
        # rank 0's step, so a tighter watchdog (behind the collectives' own timeout) fails it fast.
        # With the defence collective_timeout off there is no step watchdog at all (None).
        self.step_timeout_s: float | None = (
            None
            if not config.collective_timeout
            else step_timeout_s
            if config.tensor_parallel * config.pipeline_parallel == 1
            else min(step_timeout_s, STEP_TIMEOUT_S)
        )
        self.step_started: float | None = None
        self.state = ReplicaState.STARTING
        self.stats: ReplicaStats | None = None  # the latest step's, once it reports
        self.error: str | None = None
        self.permanent = False  # its failure would repeat on a restart (ReplicaFailure.permanent)
        self.plan: EnginePlan | None = None  # what it runs, once ready
        self.num_token_messages = 0  # step messages that carried tokens
        self._inbox = ctx.Queue()
        self._outbox = ctx.Queue()
        self._streams: dict[str, queue.Queue] = {}
        self.on_handoff = on_handoff
        self._handing: dict[str, AddRequest] = {}  # a prefill replica's requests, to hand off
        self._segments: dict[str, SharedKV] = {}  # a decode replica's handoffs, freed if they fail
        self._streaming: set[str] = set()  # requests on it that have had their first token
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._ended = threading.Event()
        self.process = ctx.Process(
            target=replica_main,
            args=(replica_id, config, self._inbox, self._outbox, cores, heartbeat_s),
            name=f"servelab-replica-{replica_id}",
            daemon=True,
        )
        self.process.start()
        self.last_seen = WALL_CLOCK.now()
        self._reader = threading.Thread(target=self._read_loop, name=f"replica-{replica_id}-reader", daemon=True)
        self._reader.start()

    # commands ---------------------------------------------------------------------------------

    def submit(self, request: AddRequest, events: queue.Queue | None = None) -> queue.Queue:
        """Queue of events for this request (the caller's, or a new one): TokenDelta (the last
        one has finished=True) or a RequestError, after which nothing more comes.

        The request's arrival_time is the router's admission stamp, so the replica's TTFT and
        queue time include the wait in the central queue; left None, the hand-off is the arrival."""
        events = queue.Queue() if events is None else events
        with self._lock:
            if self.state != ReplicaState.READY:
                events.put(RequestError(request.request_id, None, f"replica {self.replica_id} is {self.state}"))
                return events
            self._streams[request.request_id] = events
            if self.on_handoff is not None and request.params.max_tokens > 1:
                request = dataclasses.replace(request, handoff=True)
                self._handing[request.request_id] = request
            if request.kv is not None:
                self._segments[request.request_id] = request.kv
        if request.arrival_time is None:
            request = dataclasses.replace(request, arrival_time=WALL_CLOCK.now())
        self._inbox.put(request)
        return events

    def abort(self, request_id: str) -> None:
        self._inbox.put(AbortRequest(request_id))

    def reconfigure(self, **changes: Any) -> None:
        """Levers the engine takes in place; they apply from its next step."""
        self.config = self.config.replace(**changes)
        self._inbox.put(Reconfigure(changes))

    def drain(self) -> None:
        with self._lock:
            if self.state == ReplicaState.READY:
                self.state = ReplicaState.DRAINING
        self._inbox.put(Drain())

    def stop(self, timeout: float = 10.0) -> None:
        if self.state == ReplicaState.STARTING and self.process.is_alive():
            # Still loading: it reads no command until loaded and holds no request; stop it now.
            self.kill(f"replica {self.replica_id} stopped while loading")
            return
        if self.process.is_alive():
            self._inbox.put(Stop())
            self._ended.wait(timeout)
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)

    def kill(self, reason: str) -> int:
        """Stop at once, as a terminated machine does (SIGKILL, no drain): every request on it
        fails with `reason`. Returns how many of them had already streamed a token."""
        with self._lock:
            cut = len(self._streaming & self._streams.keys())
        self._end(ReplicaState.STOPPED, reason)  # first: its streams get this reason, not "died"
        if self.process.is_alive():
            self.process.kill()  # its tensor-parallel ranks die with it (PR_SET_PDEATHSIG)
        self.process.join(10)
        return cut

    def wait_ready(self, timeout: float = 120.0) -> bool:
        self._ready.wait(timeout)
        return self.state == ReplicaState.READY

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    # the reader thread ------------------------------------------------------------------------

    def _read_loop(self) -> None:
        while not self._ended.is_set():
            try:
                msg = self._outbox.get(timeout=0.05)
            except queue.Empty:
                msg = None
            if msg is not None:
                self.last_seen = WALL_CLOCK.now()
                if isinstance(msg, Heartbeat):
                    self.step_started = msg.step_started
                else:
                    self._dispatch(msg)
            self._check_alive()

    def _dispatch(self, msg: StepMessage) -> None:
        self.num_token_messages += bool(msg.deltas)
        if self.on_message is not None:
            self.on_message(msg)
        handoffs: list[tuple[AddRequest, TokenDelta, queue.Queue]] = []
        with self._lock:
            for delta in msg.deltas:
                self._segments.pop(delta.request_id, None)  # it runs: its segment was read
                events = self._streams.get(delta.request_id)
                if events is not None:
                    if delta.handoff is not None:  # its first token to the client; it decodes elsewhere
                        events.put(dataclasses.replace(delta, handoff=None))
                        del self._streams[delta.request_id]
                        self._streaming.discard(delta.request_id)
                        handoffs.append((self._handing.pop(delta.request_id), delta, events))
                        continue
                    events.put(delta)
                    if delta.token_ids:
                        self._streaming.add(delta.request_id)
                    if delta.finished:
                        del self._streams[delta.request_id]
                        self._streaming.discard(delta.request_id)
                        self._handing.pop(delta.request_id, None)
                elif delta.handoff is not None:  # nobody waits for it any more
                    delta.handoff.discard()
            for error in msg.errors:
                events = self._streams.pop(error.request_id, None)
                self._streaming.discard(error.request_id)
                self._handing.pop(error.request_id, None)
                if (segment := self._segments.pop(error.request_id, None)) is not None:
                    segment.discard()
                if events is not None:
                    events.put(error)
            if msg.stats is not None:
                self.stats = msg.stats
            if msg.plan is not None:
                self.plan = msg.plan
            if msg.failure is not None:
                self.error, self.permanent = msg.failure.reason, msg.failure.permanent
            if not (self.state == ReplicaState.DRAINING and msg.state == ReplicaState.READY):
                self.state = ReplicaState(msg.state)
        assert self.on_handoff is not None or not handoffs
        for request, delta, events in handoffs:
            self.on_handoff(request, delta, events)  # type: ignore[misc]
        if msg.state in (ReplicaState.READY, *ENDED):
            self._ready.set()
        if msg.state in ENDED:
            self._end(msg.state, self.error or f"replica {self.replica_id} {msg.state}")

    def _check_alive(self) -> None:
        if not self.process.is_alive():
            self._end(ReplicaState.FAILED, f"replica {self.replica_id} died (exit code {self.process.exitcode})")
        elif self.state == ReplicaState.STARTING:
            return  # loading the model sends nothing for a while
        elif (now := WALL_CLOCK.now()) - self.last_seen > self.heartbeat_timeout_s:
            self.process.kill()  # frozen (e.g. SIGSTOP): fail it loudly rather than wait on it
            self._end(ReplicaState.FAILED, f"replica {self.replica_id} sent nothing for {self.heartbeat_timeout_s:.1f} s")
        elif self.step_timeout_s is not None and self.step_started is not None and now - self.step_started > self.step_timeout_s:
            self.process.kill()
            self._end(ReplicaState.FAILED, f"replica {self.replica_id} stuck in one step for {self.step_timeout_s:.0f} s")

    def _end(self, state: ReplicaState, reason: str) -> None:
        with self._lock:
            if self.state != ReplicaState.STOPPED:
                self.state = ReplicaState(state)
            streams, self._streams = self._streams, {}
            self._streaming.clear()
            segments, self._segments = self._segments, {}
            self._handing.clear()
        for segment in segments.values():  # handed over and not yet read: nobody else will
            segment.discard()
        for request_id, events in streams.items():
            events.put(RequestError(request_id, None, reason))
        if state == ReplicaState.FAILED and not self.permanent:  # a permanent one: the fleet says it, once
            log.warning(reason)
        self._ready.set()
        self._ended.set()
