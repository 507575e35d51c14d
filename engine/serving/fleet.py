"""The fleet: the replicas, the router in front of them, the metrics bus, and the server's
lifecycle (ready, draining, stopped). What the API layer talks to; it holds no model itself,
only the tokenizer, so the front process stays light."""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.clock import WALL_CLOCK, Clock
from engine.config import EngineConfig
from engine.model.gguf_file import context_length
from engine.model.paths import DEFAULT_MODEL_NAME, default_gguf_path
from engine.model.tokenizer import ChatTokenizer, load_tokenizer
from engine.sampling_params import SamplingParams
from engine.serving.events import EventLog
from engine.serving.metrics import MetricsBus
from engine.serving.replica import ReplicaHandle
from engine.serving.replica_api import ReplicaFactory
from engine.serving.router import AdmissionError, Router, RouterConfig

log = logging.getLogger("servelab.fleet")

FAILED_SHOWN_S = 10.0  # a failed replica stays in the set (and on the charts) this long
SNAPSHOT_HZ = 6.0  # the live stream promises at least 5 a second


@dataclass
class FleetConfig:
    replicas: int = 1
    drain_timeout_s: float = 30.0
    warm_pool: int = 0  # replicas loaded and idle, not routed to: a scale-up takes one in under a second
    provision_delay_s: float = 0.0  # what a cold start waits before it loads (a GPU being provisioned)


@dataclass
class Order:
    """A replica being provisioned: it starts when the delay has passed, unless cancelled first."""

    pool: bool  # for the warm pool, or to serve
    delay_s: float
    cancelled: threading.Event = field(default_factory=threading.Event)


def split_cores(num_replicas: int) -> list[list[int]]:
    """Each replica gets its share of this process's cores (they share when there are fewer)."""
    cores = sorted(os.sched_getaffinity(0))
    if num_replicas >= len(cores):
        return [[cores[i % len(cores)]] for i in range(num_replicas)]
    per = len(cores) // num_replicas
    return [cores[i * per : (i + 1) * per] for i in range(num_replicas)]


class Fleet:
    """Replicas come and go while it serves: rebuilt when a lever needs it, added and retired by
    the autoscaler. A retired replica drains (finishes its residents) before it stops.

    The warm pool is replicas already loaded but not given to the router: scale_up promotes one
    in well under a second, else orders a cold start (provision_delay_s, then the model load),
    and refills the pool in the background. replica_states() shows pool replicas as "warm"
    (loaded) or "warming" (provisioning or loading), and serving orders as "provisioning"."""

    def __init__(
        self,
        engine_config: EngineConfig,
        router_config: RouterConfig,
        fleet_config: FleetConfig,
        replica_factory: ReplicaFactory | None = None,
        clock: Clock = WALL_CLOCK,
    ) -> None:
        """replica_factory(replica_id, config, cores=, on_message=) makes each replica; None: a
        ReplicaHandle (a live replica process). clock: what the fleet, its router, bus and event
        log read time from."""
        self.replica_factory: ReplicaFactory = replica_factory or ReplicaHandle
        self.clock = clock
        path = engine_config.model or str(default_gguf_path())
        self.model_name = DEFAULT_MODEL_NAME if engine_config.model is None else Path(path).stem
        self.tokenizer: ChatTokenizer = load_tokenizer(path)
        self.engine_config = engine_config
        self.fleet_config = fleet_config
        self.events = EventLog(clock)
        self.bus = MetricsBus(clock, events=self.events)
        router_config.block_size = engine_config.block_size
        self.context_length = context_length(Path(path))
        router_config.max_model_len = min(engine_config.max_model_len or self.context_length, self.context_length)
        self.router = Router([], router_config, clock, events=self.events)
        self.replicas: list[ReplicaHandle] = []  # serving, or starting to
        self.retiring: list[ReplicaHandle] = []  # draining: no new work, finishing their residents
        self.warm: list[ReplicaHandle] = []  # the warm pool: loaded (or loading), idle, not routed to
        self.orders: list[Order] = []  # replicas being provisioned
        self.warm_pool = fleet_config.warm_pool
        self.provision_delay_s = fleet_config.provision_delay_s
        self._cores: dict[int, list[int]] = {}
        self._next_id = 0
        self._lock = threading.RLock()
        self._last_states: dict[int, str] = {}
        self._failed_at: dict[int, float] = {}
        self.set_replica_count(fleet_config.replicas)
        for _ in range(self.warm_pool):  # the first pool is there from the start, like the first replicas
            self._start(self._spare_cores(), serve=False)
        self.draining = False
        self._drained = threading.Event()
        self._subscribers: list[Callable[[dict], None]] = []
        threading.Thread(target=self._publish, name="snapshots", daemon=True).start()

    # the replica set ----------------------------------------------------------------------------

    def set_replica_count(self, count: int) -> None:
        """Start or retire replicas until `count` serve; cores are shared out afresh."""
        with self._lock:
            while len(self.replicas) > count:
                self.retire(self.replicas[-1])
            cores = split_cores(count)
            while len(self.replicas) < count:
                self._start(cores[len(self.replicas)])

    def _start(self, cores: list[int], serve: bool = True) -> ReplicaHandle:
        """A new replica process: serving (the router sees it once ready), or into the warm pool
        (no metrics until promoted, so idle pool replicas do not dilute the fleet's utilisation)."""
        on_message = self.bus.observe if serve else None
        replica = self.replica_factory(self._next_id, self.engine_config, cores=cores, on_message=on_message)
        self._cores[replica.replica_id] = cores
        self._next_id += 1
        if serve:
            self.replicas.append(replica)
            self.router.set_replicas(self.replicas)
        else:
            self.warm.append(replica)
        return replica

    def _spare_cores(self) -> list[int]:
        """The least-used core, for a replica started beside the others (they share when few)."""
        use = dict.fromkeys(sorted(os.sched_getaffinity(0)), 0)
        for replica in self.replicas + self.warm:
            for core in self._cores.get(replica.replica_id, []):
                use[core] = use.get(core, 0) + 1
        return [min(use, key=use.__getitem__)]

    # scaling (the autoscaler's actuator) --------------------------------------------------------

    def scale_up(self, count: int = 1) -> str:
        """Add `count` serving replicas: from the warm pool when it has any (loaded ones first),
        else cold starts after provision_delay_s; then refill the pool. Says what it did."""
        done = []
        with self._lock:
            for _ in range(count):
                pool = [r for r in self.warm if r.state in ("ready", "starting")]
                if pool:
                    replica = min(pool, key=lambda r: r.state != "ready")
                    self.warm.remove(replica)
                    replica.on_message = self.bus.observe
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
        (starting ones first: nothing runs there). Says what it did."""
        with self._lock:
            serving_orders = [o for o in self.orders if not o.pool]
            if serving_orders:
                self._cancel(serving_orders[-1])
                return "cancelled a replica still provisioning"
            candidates = [r for r in self.replicas if r.state in ("starting", "ready")]
            if not candidates:
                return "nothing to drain"
            replica = min(candidates, key=lambda r: (r.state == "ready", r.num_in_flight))
            residents = replica.num_in_flight
            self.retire(replica)
            return f"draining replica {replica.replica_id}, {residents} request(s) still on it"

    def set_warm_pool(self, count: int) -> None:
        with self._lock:
            self.warm_pool = count
            self._fill_pool()

    def set_provision_delay(self, seconds: float) -> None:
        """Applies to orders from now on; ones already waiting keep their delay."""
        self.provision_delay_s = seconds

    def _fill_pool(self) -> None:
        """Order pool replicas up to warm_pool, or let the extra ones go (orders first)."""
        pool_orders = [o for o in self.orders if o.pool]
        for _ in range(self.warm_pool - len(self.warm) - len(pool_orders)):
            self._order(pool=True)
        excess = max(0, len(self.warm) + len(pool_orders) - self.warm_pool)
        for order in pool_orders[:excess]:
            self._cancel(order)
        for replica in sorted(self.warm, key=lambda r: r.state == "ready")[: max(0, excess - len(pool_orders))]:
            self.warm.remove(replica)
            self.retiring.append(replica)
            replica.drain()  # idle: it stops at once

    def _order(self, pool: bool) -> None:
        order = Order(pool, self.provision_delay_s)
        self.orders.append(order)
        threading.Thread(target=self._provision, args=(order,), name="provision", daemon=True).start()

    def _provision(self, order: Order) -> None:
        if order.cancelled.wait(order.delay_s):
            return
        with self._lock:
            if order.cancelled.is_set():
                return
            self.orders.remove(order)
            self._start(self._spare_cores(), serve=not order.pool)

    def _cancel(self, order: Order) -> None:
        order.cancelled.set()
        self.orders.remove(order)

    def retire(self, replica: ReplicaHandle) -> None:
        """Scale-in is a drain: the router stops sending at once, the replica finishes what it
        holds, then stops; no stream is cut."""
        with self._lock:
            self.replicas.remove(replica)
            self.router.set_replicas(self.replicas)
            self.retiring.append(replica)
        replica.drain()

    def rebuild(self, engine_config: EngineConfig, count: int | None = None) -> None:
        """New replicas with a new config (paged, block_size, kv_budget_mb, ...); the old ones
        drain, so requests already running finish on the config they started with."""
        with self._lock:
            self.engine_config = engine_config
            self.router.config.block_size = engine_config.block_size
            old = list(self.replicas)
            for replica in old:
                self.retire(replica)
            for order in list(self.orders):
                self._cancel(order)
            pool, self.warm_pool = self.warm_pool, 0
            self._fill_pool()  # the old pool goes too
            self.set_replica_count(len(old) if count is None else count)
            self.warm_pool = pool
            for _ in range(pool):  # a rebuild restarts on machines already held: no provisioning
                self._start(self._spare_cores(), serve=False)

    def reconfigure(self, **changes: object) -> None:
        """Engine levers every replica takes in place (max_num_seqs, chunked_prefill, ...), the
        warm pool's too, so a promoted replica serves with the levers of the moment."""
        with self._lock:
            self.engine_config = self.engine_config.replace(**changes)
            for replica in self.replicas + self.warm:
                replica.reconfigure(**changes)

    # live view ----------------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[dict], None]) -> None:
        """callback(snapshot) SNAPSHOT_HZ times a second (the web layer's live charts)."""
        self._subscribers.append(callback)

    def _publish(self) -> None:
        period, due = 1.0 / SNAPSHOT_HZ, self.clock.now()
        while not self._drained.wait(max(0.0, (due := due + period) - self.clock.now())):
            self._watch_replicas()
            if self._subscribers:
                snap = self.snapshot()
                for callback in list(self._subscribers):
                    callback(snap)

    def _watch_replicas(self) -> None:
        """Turn replica state changes into events, and forget retired replicas once stopped."""
        with self._lock:
            for replica in [r for r in self.warm if r.state in ("stopped", "failed")]:
                self.warm.remove(replica)
                self.retiring.append(replica)
            for replica in self.replicas + self.retiring + self.warm:
                if self._last_states.get(replica.replica_id) != replica.state:
                    self._last_states[replica.replica_id] = replica.state
                    why = f": {replica.error}" if replica.state == "failed" and replica.error else ""
                    where = " (warm pool)" if replica in self.warm else ""
                    self.events.emit(
                        "replica",
                        f"replica {replica.replica_id} {replica.state}{why}{where}",
                        replica=replica.replica_id,
                        state=replica.state,
                    )
            now = self.clock.now()
            for replica in [r for r in self.replicas if r.state == "failed"]:
                # A failed replica (or shard group) stays on the charts a while, then leaves the set
                # whole; the autoscaler sees the lost capacity and orders a fresh one.
                failed_at = self._failed_at.setdefault(replica.replica_id, now)
                replaced = any(r.state in ("starting", "ready") for r in self.replicas)
                if now - failed_at >= FAILED_SHOWN_S and replaced:  # the last one stays: the router fails its queue
                    self.replicas.remove(replica)
                    self.router.set_replicas(self.replicas)
                    self.retiring.append(replica)
            for replica in [r for r in self.retiring if r.state in ("stopped", "failed")]:
                self._failed_at.pop(replica.replica_id, None)
                self.retiring.remove(replica)
                replica.stop()
                self.bus.forget(replica.replica_id)
                self._last_states.pop(replica.replica_id, None)
                self._cores.pop(replica.replica_id, None)

    def wait_ready(self, timeout: float = 300.0) -> bool:
        return all(r.wait_ready(timeout) for r in list(self.replicas))

    @property
    def ready(self) -> bool:
        return not self.draining and any(r.state == "ready" for r in self.replicas)

    def replica_states(self) -> dict[str, int]:
        """Serving replicas by state; retiring ones as "draining" until they stop (even one retired
        while loading, so it never counts as capacity); the pool as "warm" (loaded) or "warming";
        serving orders still waiting for their machine as "provisioning"."""
        with self._lock:
            names = [r.state for r in self.replicas]
            names += ["draining" if r.state in ("starting", "ready") else r.state for r in self.retiring]
            names += [{"ready": "warm", "starting": "warming"}.get(r.state, r.state) for r in self.warm]
            names += ["warming" if o.pool else "provisioning" for o in self.orders]
        states: dict[str, int] = {}
        for name in names:
            states[name] = states.get(name, 0) + 1
        return states

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        api_key: str | None,
        events: queue.Queue | None = None,
    ) -> queue.Queue:
        if self.draining:
            raise AdmissionError(503, "draining", "the server is shutting down")
        if not self.ready:
            raise AdmissionError(503, "not_ready", "no replica is ready")
        return self.router.submit(request_id, prompt_token_ids, params, api_key, events)

    def metrics_text(self) -> str:
        return self.bus.prometheus_text(
            self.model_name, len(self.router.queue), self.router.rejected, self.replica_states()
        )

    def snapshot(self) -> dict:
        return self.bus.snapshot(len(self.router.queue), self.router.rejected, self.replica_states())

    # shutdown -----------------------------------------------------------------------------------

    def drain_and_stop(self) -> None:
        """SIGTERM: refuse new work at once, let in-flight requests finish (up to drain_timeout_s),
        then stop every replica process."""
        self.draining = True
        self.set_warm_pool(0)
        deadline = self.clock.now() + self.fleet_config.drain_timeout_s
        pause = threading.Event()
        while self.clock.now() < deadline and len(self.router.queue):  # queued work still goes out
            pause.wait(0.05)
        for replica in self.replicas:
            replica.drain()
        while self.clock.now() < deadline and any(r.state == "draining" for r in self.replicas + self.retiring):
            pause.wait(0.05)
        self.stop()

    def stop(self) -> None:
        self.router.close()
        with self._lock:
            for order in list(self.orders):
                self._cancel(order)
        for replica in self.replicas + self.retiring + self.warm:
            replica.stop()
        self._drained.set()
