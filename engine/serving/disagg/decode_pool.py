"""A prefill/decode split's decode replicas (DistServe, Splitwise; vLLM's and SGLang's P/D): the
router sends each request to a prefill replica, which makes its first token and hands the prompt's
KV blocks off (engine/core/kv_handoff.py); this pool gives each handoff to a decode replica, which
decodes the rest into the same event queue. Prompts then never share a step with running
streams, so a long prompt no longer stalls them.

A handoff goes to the ready decode replica with the fewest requests; one that cannot start there
waits in that replica's own queue (its KV is imported into free blocks only, never over a block
in use). With no decode replica ready (one replaced after a failure, a rebuild's new pool still
loading), it waits here, its KV in shared memory, up to wait_s; then the request ends with that
reason in its stream and the segment is freed. A decode replica that ends is replaced."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from engine.clock import Clock
from engine.config import EngineConfig
from engine.serving.replicas.messages import AddRequest, RequestError, TokenDelta
from engine.serving.replicas.replica_api import ENDED, ReplicaState
from engine.serving.telemetry.events import EventLog

log = logging.getLogger("servelab.decode_pool")

HANDOFF_WAIT_S = 30.0  # a handoff waits this long for a decode replica to be ready (the queue's deadline)

# makes a decode replica (its id the fleet's next): (config, cores) -> a replica handle
DecodeFactory = Callable[[EngineConfig, list[int]], Any]


class DecodePool:
    def __init__(
        self, make: DecodeFactory, config: EngineConfig, cores: list[list[int]], events: EventLog,
        was_aborted: Callable[[str], bool], clock: Clock,
    ) -> None:
        """cores: one list per decode replica. was_aborted(request_id): its client went away
        before the handoff (the router remembers), so it is not decoded for nobody."""
        self._make = make
        self.config = decode_config(config)
        self.events = events
        self._was_aborted = was_aborted
        self.clock = clock  # the fleet's: how long a handoff has waited
        self._lock = threading.Lock()
        self.replicas: list[Any] = [self._start(c) for c in cores]
        self.handoffs = 0
        self.handoff_bytes = 0
        self.winding_down = False  # drained or stopped as a whole: ended replicas are not replaced
        self.wait_s = HANDOFF_WAIT_S
        # Handoffs waiting for a ready decode replica: (request, its delta, its events, since).
        self.waiting: deque[tuple[AddRequest, TokenDelta, queue.Queue, float]] = deque()

    def _start(self, cores: list[int]) -> Any:
        replica = self._make(self.config, cores)
        replica.cores = cores
        return replica

    def hand_off(self, request: AddRequest, delta: TokenDelta, events: queue.Queue) -> None:
        """A prefill replica's handoff (its ReplicaHandle calls this): on to a decode replica, or
        waiting for one."""
        assert delta.handoff is not None and delta.times is not None and delta.times.first_token is not None
        with self._lock:
            self.waiting.append((request, delta, events, self.clock.now()))
        self.place_waiting()

    def place_waiting(self) -> None:
        """Send the waiting handoffs on, oldest first, while a decode replica is ready; fail those
        that waited past wait_s, and drop those whose client went away."""
        now = self.clock.now()
        while True:
            with self._lock:
                if not self.waiting:
                    return
                request, delta, events, since = self.waiting[0]
                shared = delta.handoff
                assert shared is not None
                ready = [r for r in self.replicas if r.state == ReplicaState.READY]
                if self._was_aborted(request.request_id) or (not ready and now - since > self.wait_s):
                    self.waiting.popleft()
                    target = None
                elif not ready:
                    return
                else:
                    self.waiting.popleft()
                    target = min(ready, key=lambda r: r.num_in_flight)
                    self.handoffs += 1
                    self.handoff_bytes += shared.nbytes
            if target is None:
                shared.discard()
                if not self._was_aborted(request.request_id):
                    why = f"no decode replica was ready to take the handoff within {self.wait_s:g} s"
                    events.put(RequestError(request.request_id, None, why))
                continue
            onward = dataclasses.replace(
                request, prompt_token_ids=[*request.prompt_token_ids, *delta.token_ids], handoff=False, kv=shared,
                first_token_at=delta.times.first_token,  # type: ignore[union-attr]
            )  # fmt: skip
            target.submit(onward, events)

    def abort(self, request_id: str) -> None:
        for replica in list(self.replicas):
            replica.abort(request_id)

    def reconfigure(self, **changes: Any) -> None:
        self.config = self.config.replace(**changes)
        for replica in list(self.replicas):
            replica.reconfigure(**changes)

    def watch(self) -> list[Any]:
        """Replace the decode replicas that ended (failed, killed, or drained from outside), while
        the pool itself is not winding down; a permanent failure is said once and not retried.
        The replicas that ended, to stop and forget."""
        self.place_waiting()
        with self._lock:
            ended = [r for r in self.replicas if r.state in ENDED]
            for replica in ended:
                self.replicas.remove(replica)
                if replica.state == ReplicaState.FAILED and replica.permanent:
                    log.error("decode replica %s failed for good: %s", replica.replica_id, replica.error)
                elif not self.winding_down:
                    self.events.emit("replica", f"decode replica {replica.replica_id} {replica.state}: replaced")
                    self.replicas.append(self._start(replica.cores))
        return ended

    def drain(self) -> None:
        self.winding_down = True
        for replica in list(self.replicas):
            replica.drain()

    def take_waiting(self) -> list[tuple[AddRequest, TokenDelta, queue.Queue]]:
        """The handoffs still waiting, out of this pool (a rebuild hands them to the next one)."""
        with self._lock:
            waiting, self.waiting = self.waiting, deque()
        return [(request, delta, events) for request, delta, events, _ in waiting]

    def stop(self) -> None:
        self.winding_down = True
        for request, delta, events in self.take_waiting():
            delta.handoff.discard()  # type: ignore[union-attr]
            events.put(RequestError(request.request_id, None, "the server stopped before the handoff"))
        for replica in list(self.replicas):
            replica.stop()

    @property
    def num_in_flight(self) -> int:
        return len(self.waiting) + sum(r.num_in_flight for r in self.replicas)


def decode_config(config: EngineConfig) -> EngineConfig:
    """A decode replica finds a handed-off prompt through its prefix cache: always on there."""
    return config.replace(prefix_caching=True)
