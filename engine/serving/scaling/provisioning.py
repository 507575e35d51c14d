"""Provisioning: how the fleet grows and shrinks when the autoscaler asks (the actuator), with
the warm pool beside it. A mixin of Fleet (engine/serving/scaling/fleet.py), which holds the replica set
this changes; kept apart because it is one job: orders, the pool, and scale-in.

Scale-in drains by default: the router stops sending at once and the replica finishes what it
holds. With the defence `drain_on_scale_in` off it is killed instead, as a cloud instance
terminated without a drain hook would be: every stream on it ends with an error, and those that
had already sent a token are counted (`streams_cut_mid_stream`: cut mid-sentence).

The fleet counts what the autoscaler did to it, for the live snapshot and /metrics:
`scale_changes_total` (scale-ups and scale-ins that changed the replica count: a flapping fleet
shows here) and `replicas_ordered_total` (replicas asked for, from the pool or cold: a fleet that
does not count replicas still starting as capacity orders far beyond need here)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from engine.clock import Clock
from engine.serving.driver import Driver
from engine.serving.replicas.replica_api import SERVING, ReplicaState
from engine.serving.routing.defences import Defences
from engine.serving.routing.router import Router
from engine.serving.scaling.fleet_config import FleetConfig
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.metrics import MetricsBus

log = logging.getLogger("servelab.fleet")

SCALE_COUNTERS = ("streams_cut_mid_stream", "scale_changes_total", "replicas_ordered_total")


@dataclass
class Order:
    """A replica being provisioned: it starts when the delay has passed, unless cancelled first."""

    pool: bool  # for the warm pool, or to serve
    delay_s: float
    cancelled: bool = False


class Provisioning:
    """Fleet's scaling half. It reads and changes the Fleet's replica set under the Fleet's lock;
    the attributes below are the Fleet's (declared here for the type checker)."""

    replicas: list[Any]
    retiring: list[Any]
    warm: list[Any]
    orders: list[Order]
    router: Router
    bus: MetricsBus
    driver: Driver
    defences: Defences
    _lock: threading.RLock
    _stopped: bool
    streams_cut_mid_stream: int
    scale_changes_total: int
    replicas_ordered_total: int
    fleet_config: FleetConfig
    unservable: str | None
    events: EventLog
    clock: Clock

    # Fleet's, used here: warm_pool and provision_delay_s (its FleetConfig's), _start(cores,
    # serve), _spare_cores(), retire(replica), observe_replica(msg), ready, watch_once().

    # the autoscaler's actuator ------------------------------------------------------------------

    def scale_up(self, count: int = 1) -> str:
        """Add `count` serving replicas: from the warm pool when it has any (loaded ones first),
        else cold starts after provision_delay_s; then refill the pool. Says what it did."""
        done = []
        if self.unservable is not None:
            return f"nothing ordered: {self.unservable}"
        with self._lock:
            self.replicas_ordered_total += max(0, count)
            self.scale_changes_total += count > 0
            for _ in range(count):
                pool = [r for r in self.warm if r.state in SERVING]
                if pool:
                    replica = min(pool, key=lambda r: r.state != ReplicaState.READY)
                    self.warm.remove(replica)
                    replica.on_message = self.observe_replica
                    self.replicas.append(replica)
                    self.router.set_replicas(self.replicas)
                    done.append(f"replica {replica.replica_id} from the warm pool")
                else:
                    self._order(pool=False)
                    done.append(f"cold start: {self.provision_delay_s:g} s to provision, then the model load")
            self._fill_pool()
        return "; ".join(done)

    def scale_down(self) -> str:
        """One replica fewer: cancel one still provisioning, else drain the least-loaded one
        (starting ones first: nothing runs there), or kill it with drain_on_scale_in off. Says
        what it did."""
        with self._lock:
            serving_orders = [o for o in self.orders if not o.pool]
            if serving_orders:
                self._cancel(serving_orders[-1])
                self.scale_changes_total += 1
                return "cancelled a replica still provisioning"
            candidates = [r for r in self.replicas if r.state in SERVING]
            if not candidates:
                return "nothing to drain"
            replica = min(candidates, key=lambda r: (r.state == ReplicaState.READY, r.num_in_flight))
            self.scale_changes_total += 1
            if not self.defences.drain_on_scale_in:  # read now: the lever may have just moved
                return self.kill(replica)
            residents = replica.num_in_flight
            self.retire(replica)
            return f"draining replica {replica.replica_id}, {residents} request(s) still on it"

    def kill(self, replica: Any) -> str:
        """Scale-in without a drain: the replica leaves the router and stops at once; every
        request on it fails, and the streams that had begun are counted as cut mid-stream."""
        with self._lock:
            self.replicas.remove(replica)
            self.router.set_replicas(self.replicas)
            self.retiring.append(replica)
            residents = replica.num_in_flight
            cut = replica.kill(f"replica {replica.replica_id} was scaled in without a drain")
            self.streams_cut_mid_stream += cut
        return f"killed replica {replica.replica_id} (no drain): {residents} request(s) cut, {cut} mid-stream"

    def scale_counts(self) -> dict[str, int]:
        """The snapshot's scaling keys (SCALE_COUNTERS), running totals since the fleet began."""
        return {key: int(getattr(self, key)) for key in SCALE_COUNTERS}

    def scale_metrics_lines(self) -> list[str]:
        """The same counts in Prometheus text."""
        lines = []
        for key in SCALE_COUNTERS:
            name = f"servelab_{key.removesuffix('_total')}_total"
            lines += [f"# TYPE {name} counter", f"{name} {getattr(self, key)}"]
        return lines

    # the warm pool and orders -------------------------------------------------------------------

    # a fleet that cannot serve -----------------------------------------------------------------

    def _note_unservable(self) -> None:
        """A replica failed for good (ReplicaFailure.permanent): say so once, order nothing more."""
        if self.unservable is not None:
            return
        failed = [r for r in self.replicas + self.warm if r.state == ReplicaState.FAILED and getattr(r, "permanent", False)]
        if not failed:
            return
        self.unservable = failed[0].error or f"replica {failed[0].replica_id} failed to load"
        for order in list(self.orders):
            self._cancel(order)
        log.error("cannot serve: %s (not retried: a restart would fail the same way)", self.unservable)
        self.events.emit("replica", f"cannot serve: {self.unservable}; no replica is ordered until the configuration changes")

    def wait_serving(self, timeout: float = 600.0) -> bool:
        """Until a replica is ready (True), or the fleet cannot serve or the time is up (False).
        The composition roots wait here: a live start-up, on wall time by design."""
        pause = threading.Event()
        deadline = self.clock.now() + timeout
        while not self.ready and self.clock.now() < deadline and not self._stopped:
            self.watch_once()
            if self.unservable is not None:
                return False
            pause.wait(0.1)
        return self.ready

    def set_warm_pool(self, count: int) -> None:
        with self._lock:
            self.fleet_config.warm_pool = count
            self._fill_pool()

    def set_provision_delay(self, seconds: float) -> None:
        """Applies to orders from now on; ones already waiting keep their delay."""
        self.fleet_config.provision_delay_s = seconds

    def _fill_pool(self) -> None:
        """Order pool replicas up to warm_pool, or let the extra ones go (orders first)."""
        pool_orders = [o for o in self.orders if o.pool]
        for _ in range(0 if self.unservable is not None else self.warm_pool - len(self.warm) - len(pool_orders)):
            self._order(pool=True)
        excess = max(0, len(self.warm) + len(pool_orders) - self.warm_pool)
        for order in pool_orders[:excess]:
            self._cancel(order)
        for replica in sorted(self.warm, key=lambda r: r.state == ReplicaState.READY)[: max(0, excess - len(pool_orders))]:
            self.warm.remove(replica)
            self.retiring.append(replica)
            replica.drain()  # idle: it stops at once

    def _order(self, pool: bool) -> None:
        order = Order(pool, self.provision_delay_s)
        self.orders.append(order)
        self.driver.after(order.delay_s, lambda: self._provision(order))

    def _provision(self, order: Order) -> None:
        """The machine came: the replica starts (and loads) unless the order was cancelled."""
        with self._lock:
            if order.cancelled or self._stopped:
                return
            self.orders.remove(order)
            self._start(self._spare_cores(), serve=not order.pool)

    def _cancel(self, order: Order) -> None:
        order.cancelled = True
        self.orders.remove(order)
