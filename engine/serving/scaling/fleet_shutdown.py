"""Fleet's shutdown half: a drain (SIGTERM: refuse new work, let in-flight requests finish up to
drain_timeout_s, then stop), driven by the fleet's own step so the virtual clock drives it too."""

from __future__ import annotations

import threading
from typing import Any

from engine.clock import Clock
from engine.serving.driver import Driver
from engine.serving.replicas.replica_api import ReplicaState
from engine.serving.routing.router import Router
from engine.serving.scaling.fleet_config import FleetConfig

DRAIN_POLL_S = 0.05  # how often a drain looks at what is left


class Shutdown:
    """The attributes below are the Fleet's (declared here for the type checker); so are
    set_warm_pool (Provisioning's) and stop."""

    replicas: list[Any]
    retiring: list[Any]
    router: Router
    driver: Driver
    clock: Clock
    fleet_config: FleetConfig
    draining: bool
    _drain_deadline: float
    _replicas_draining: bool
    _stopped: bool
    _drained: threading.Event

    def downstream(self) -> list[Any]:
        """Replicas that serve behind the router's: a prefill/decode split's decode pool."""
        return []

    def drain_downstream(self) -> None:
        """Drain them as a whole (the pool then replaces none that stops)."""

    # shutdown -----------------------------------------------------------------------------------

    def drain_and_stop(self) -> None:
        """SIGTERM: begin the drain, and wait (a live shutdown, on wall time) until it has stopped
        every replica process."""
        self.begin_drain()
        self._drained.wait()

    @property
    def drained(self) -> bool:
        """Stopped: by a drain's end or by stop()."""
        return self._drained.is_set()

    def begin_drain(self) -> None:
        """Refuse new work at once; the fleet's own step (drain_step, on its clock, so the virtual
        one drives it too) lets in-flight requests finish, up to drain_timeout_s, then stops."""
        if self.draining:
            return
        self.draining = True
        self.set_warm_pool(0)
        self._drain_deadline = self.clock.now() + self.fleet_config.drain_timeout_s
        self._replicas_draining = False
        self.driver.every(DRAIN_POLL_S, self.drain_step)

    def drain_step(self) -> bool:
        """One look at the drain: queued work still goes out, then the replicas finish their
        residents; past the deadline, or with nothing left, stop. False once stopped."""
        if self._stopped:
            return False
        late = self.clock.now() >= self._drain_deadline
        if not self._replicas_draining:
            if len(self.router.queue) and not late:
                return True
            for replica in self.replicas:
                replica.drain()
            self.drain_downstream()  # decode replicas finish their streams too
            self._replicas_draining = True
            return True
        if not late and any(r.state == ReplicaState.DRAINING for r in self.replicas + self.retiring + self.downstream()):
            return True
        self.stop()
        return False

