"""Fleet's prefill/decode split (engine/serving/disagg/): with fleet_config.decode_replicas, a
decode pool behind the routed replicas, which then prefill and hand each request on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from engine.clock import Clock
from engine.config import EngineConfig
from engine.serving.disagg.decode_pool import DecodePool
from engine.serving.replicas.cores import split_cores
from engine.serving.replicas.messages import RequestError, StepMessage
from engine.serving.routing.router import Router
from engine.serving.scaling.fleet_config import FleetConfig
from engine.serving.telemetry.events import EventLog


class Split:
    """The attributes below are the Fleet's (declared here for the type checker)."""

    decode: DecodePool | None
    fleet_config: FleetConfig
    engine_config: EngineConfig
    router: Router
    events: EventLog
    replica_factory: Callable[..., Any]
    _cores: dict[int, list[int]]
    _next_id: int
    _lock: threading.RLock
    clock: Clock
    observe_replica: Callable[[StepMessage], None]

    def _start_decode_pool(self, serving: int) -> None:
        """A prefill/decode split's decode replicas (fleet_config.decode_replicas), on the cores
        after the share of the `serving` replicas."""
        count = self.fleet_config.decode_replicas
        if not count:
            self.decode = None
            self.router.downstream = []
            return
        cores = split_cores(serving + count)[-count:]

        def make(config: EngineConfig, cores: list[int]) -> Any:
            replica_id, self._next_id = self._next_id, self._next_id + 1
            self._cores[replica_id] = cores
            return self.replica_factory(replica_id, config, cores=cores, on_message=self.observe_replica)

        self.decode = DecodePool(make, self.engine_config, cores, self.events, self.router.was_aborted, self.clock)
        self.router.downstream = self.decode.replicas

    def _hand_off(self, request: Any, delta: Any, events: Any) -> None:
        """To the decode pool of the moment (a replica retired by a rebuild hands to the new one)."""
        if self.decode is None:  # the split was turned off since: nothing decodes it now
            delta.handoff.discard()
            events.put(RequestError(request.request_id, None, "the prefill/decode split was turned off mid-request"))
            return
        self.decode.hand_off(request, delta, events)

    def downstream(self) -> list[Any]:
        return [] if self.decode is None else list(self.decode.replicas)

    def drain_downstream(self) -> None:
        if self.decode is not None:
            self.decode.drain()

