"""A prefill/decode split's decode replicas (DistServe, Splitwise; vLLM's and SGLang's P/D): the
router sends each request to a prefill replica, which makes its first token and hands the prompt's
KV blocks off (engine/kv_handoff.py); this pool gives each handoff to a decode replica, which
decodes the rest into the same event queue. Prompts then never share a step with running
streams, so a long prompt no longer stalls them.

A handoff goes to the ready decode replica with the fewest requests; one that cannot start there
waits in that replica's own queue (its KV is imported into free blocks only, never over a block
in use). With no decode replica ready, the request ends with an error in its stream and its KV
segment is freed. A decode replica that fails is replaced, as a serving one is."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from engine.config import EngineConfig
from engine.serving.replicas.messages import AddRequest, RequestError, TokenDelta
from engine.serving.replicas.replica_api import ENDED, ReplicaState
from engine.serving.telemetry.events import EventLog

log = logging.getLogger("servelab.decode_pool")

# makes a decode replica (its id the fleet's next): (config, cores) -> a replica handle
DecodeFactory = Callable[[EngineConfig, list[int]], Any]


class DecodePool:
    def __init__(
        self, make: DecodeFactory, config: EngineConfig, cores: list[list[int]], events: EventLog,
        was_aborted: Callable[[str], bool],
    ) -> None:
        """cores: one list per decode replica. was_aborted(request_id): its client went away
        before the handoff (the router remembers), so it is not decoded for nobody."""
        self._make = make
        self.config = decode_config(config)
        self.events = events
        self._was_aborted = was_aborted
        self._lock = threading.Lock()
        self.replicas: list[Any] = [self._start(c) for c in cores]
        self.handoffs = 0
        self.handoff_bytes = 0
        self.winding_down = False  # drained or stopped as a whole: ended replicas are not replaced

    def _start(self, cores: list[int]) -> Any:
        replica = self._make(self.config, cores)
        replica.cores = cores
        return replica

    def hand_off(self, request: AddRequest, delta: TokenDelta, events: queue.Queue) -> None:
        """A prefill replica's handoff (its ReplicaHandle calls this): on to a decode replica."""
        shared = delta.handoff
        assert shared is not None and delta.times is not None and delta.times.first_token is not None
        if self._was_aborted(request.request_id):
            shared.discard()
            return
        with self._lock:
            ready = [r for r in self.replicas if r.state == ReplicaState.READY]
            target = min(ready, key=lambda r: r.num_in_flight) if ready else None
            if target is not None:
                self.handoffs += 1
                self.handoff_bytes += shared.nbytes
        if target is None:
            shared.discard()
            events.put(RequestError(request.request_id, None, "no decode replica is ready to take the handoff"))
            return
        onward = dataclasses.replace(
            request, prompt_token_ids=[*request.prompt_token_ids, *delta.token_ids], handoff=False, kv=shared,
            first_token_at=delta.times.first_token,
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

    def stop(self) -> None:
        self.winding_down = True
        for replica in list(self.replicas):
            replica.stop()

    @property
    def num_in_flight(self) -> int:
        return sum(r.num_in_flight for r in self.replicas)


def decode_config(config: EngineConfig) -> EngineConfig:
    """A decode replica finds a handed-off prompt through its prefix cache: always on there."""
    return config.replace(prefix_caching=True)
