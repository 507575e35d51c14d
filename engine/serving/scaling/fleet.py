"""The fleet: the replicas, the router in front of them, the metrics bus, and the server's
lifecycle (ready, draining, stopped). What the API layer talks to; it holds no model itself,
only the tokenizer, so the front process stays light. No loop of its own: watching, snapshots,
dispatch and provisioning are steps its driver runs (threads live, the EventLoop simulated)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.clock import WALL_CLOCK, Clock
from engine.config import EngineConfig
from engine.model.gguf_file import context_length
from engine.model.paths import DEFAULT_MODEL_NAME, default_gguf_path
from engine.model.tokenizer import ChatTokenizer, load_tokenizer
from engine.platform.machine import EnginePlan
from engine.sampling_params import SamplingParams
from engine.serving.disagg.decode_pool import DecodePool
from engine.serving.driver import Driver, WallClockDriver
from engine.serving.replicas.cores import spare_cores, split_cores
from engine.serving.replicas.messages import StepMessage
from engine.serving.replicas.replica import ReplicaHandle
from engine.serving.replicas.replica_api import ENDED, SERVING, PoolState, ReplicaFactory, ReplicaState
from engine.serving.routing.defences import Defences
from engine.serving.routing.router import AdmissionError, Router, RouterConfig
from engine.serving.scaling.fleet_config import FleetConfig
from engine.serving.scaling.fleet_shutdown import Shutdown
from engine.serving.scaling.fleet_split import Split
from engine.serving.scaling.provisioning import Order, Provisioning
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.metrics import MetricsBus
from engine.serving.telemetry.snapshot import SNAPSHOT_HZ, FleetSnapshot  # SNAPSHOT_HZ: also re-exported
from engine.serving.telemetry.traces import RequestTraces

log = logging.getLogger("servelab.fleet")

POOL_NAMES = {ReplicaState.READY: PoolState.WARM, ReplicaState.STARTING: PoolState.WARMING}
FAILED_SHOWN_S = 10.0  # a failed replica stays in the set (and on the charts) this long


class Fleet(Provisioning, Split, Shutdown):
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
        driver: Driver | None = None,
        model: tuple[str, int] | None = None,
        events: EventLog | None = None,
        defences: Defences | None = None,
    ) -> None:
        """replica_factory(replica_id, config, cores=, on_message=) makes each replica; None: a
        ReplicaHandle (a live replica process). clock: what the fleet, its router, bus and event
        log read time from. driver: what runs its steps; None: a WallClockDriver of its own.
        model: (name, context length) of a simulated model: no file is read, no tokenizer.
        events: an event log to share (a simulated prefill/decode split's two pools); None: its own.
        defences: the serving layer's guards (engine/serving/routing/defences.py); None: all on."""
        self.replica_factory: ReplicaFactory = replica_factory or ReplicaHandle
        self.clock = clock
        self._tokenizer: ChatTokenizer | None = None
        if model is None:
            path = engine_config.model or str(default_gguf_path())
            self.model_name = DEFAULT_MODEL_NAME if engine_config.model is None else Path(path).stem
            self._tokenizer = load_tokenizer(path)
            self.context_length = context_length(Path(path))
        else:
            self.model_name, self.context_length = model
        self.engine_config = engine_config
        self.fleet_config = fleet_config
        self.defences = Defences() if defences is None else defences
        self.events = EventLog(clock) if events is None else events
        self.bus = MetricsBus(clock, events=self.events)
        self.traces = RequestTraces(clock)  # one row per recent request, for the swimlanes
        router_config.block_size = engine_config.block_size
        router_config.max_model_len = min(engine_config.max_model_len or self.context_length, self.context_length)
        self.router = Router(
            [], router_config, clock, events=self.events, dispatch_thread=False, defences=self.defences, traces=self.traces
        )
        self.replicas: list[Any] = []  # serving, or starting to
        self.retiring: list[Any] = []  # draining: no new work, finishing their residents
        self.warm: list[Any] = []  # the warm pool: loaded (or loading), idle, not routed to
        self.orders: list[Order] = []  # replicas being provisioned
        self.streams_cut_mid_stream = 0  # the scaling counters (provisioning.SCALE_COUNTERS)
        self.scale_changes_total = 0
        self.replicas_ordered_total = 0
        self._own_driver = driver is None
        self.driver: Driver = WallClockDriver("fleet") if driver is None else driver
        self._cores: dict[int, list[int]] = {}
        self._next_id = 0
        self._lock = threading.RLock()
        self._last_states: dict[int, str] = {}
        self._failed_at: dict[int, float] = {}
        self.draining = False  # begin_drain: refusing new work, finishing what it has
        self._drain_deadline = float("inf")
        self._replicas_draining = False
        # Why no replica can serve, when one failed in a way a restart repeats (a dtype this CPU
        # cannot run, a missing model file): nothing more is ordered until the config changes.
        self.unservable: str | None = None
        self._stopped = False
        self._drained = threading.Event()
        self._subscribers: list[Callable[[FleetSnapshot], None]] = []
        self.decode: DecodePool | None = None
        self._start_decode_pool(fleet_config.replicas)
        self.set_replica_count(fleet_config.replicas)
        for _ in range(self.warm_pool):  # the first pool is there from the start, like the first replicas
            self._start(self._spare_cores(), serve=False)
        self.driver.every(Router.DISPATCH_POLL_S, self.router.dispatch_step, wake=self.router.wake)
        self.driver.every(1.0 / SNAPSHOT_HZ, self.publish_step)

    @property
    def tokenizer(self) -> ChatTokenizer:
        if self._tokenizer is None:  # a simulated fleet (model=...) is handed token ids only
            raise RuntimeError(f"{self.model_name}: a simulated fleet has no tokenizer")
        return self._tokenizer

    @property
    def warm_pool(self) -> int:
        return self.fleet_config.warm_pool

    @property
    def provision_delay_s(self) -> float:
        return self.fleet_config.provision_delay_s

    # the replica set ----------------------------------------------------------------------------

    def set_replica_count(self, count: int) -> None:
        """Start or retire replicas until `count` serve; cores are shared out afresh."""
        with self._lock:
            while len(self.replicas) > count:
                self.retire(self.replicas[-1])
            cores = split_cores(count + self.fleet_config.decode_replicas)  # the decode pool's come after
            while len(self.replicas) < count and self.unservable is None:
                self._start(cores[len(self.replicas)])

    def _start(self, cores: list[int], serve: bool = True) -> Any:
        """A new replica process: serving (the router sees it once ready), or into the warm pool
        (no metrics until promoted, so idle pool replicas do not dilute the fleet's utilisation).
        None while the fleet is unservable: the same config would fail the same way."""
        if self.unservable is not None:
            return None
        on_message = self.observe_replica if serve else None
        # Split: every replica the router may use prefills, and hands each request to the decode pool.
        split = {} if self.decode is None else {"on_handoff": self._hand_off}
        replica = self.replica_factory(self._next_id, self.engine_config, cores=cores, on_message=on_message, **split)
        self._cores[replica.replica_id] = cores
        self._next_id += 1
        if serve:
            self.replicas.append(replica)
            self.router.set_replicas(self.replicas)
        else:
            self.warm.append(replica)
        return replica

    def observe_replica(self, msg: StepMessage) -> None:
        """Every message a serving replica sends: its metrics, then its requests' traces."""
        self.bus.observe(msg)
        self.traces.observe(msg)

    def _spare_cores(self) -> list[int]:
        return spare_cores(self._cores.get(r.replica_id, []) for r in self.replicas + self.warm)

    # scaling: scale_up, scale_down, kill, the warm pool and orders (engine/serving/scaling/provisioning.py)

    def retire(self, replica: Any) -> None:
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
            self.unservable = None  # a new config may load where the old one could not
            old_pool = self.decode
            if old_pool is not None:  # a split's decode replicas drain as the others do
                self.retiring += old_pool.replicas
                old_pool.drain()
            self.router.config.block_size = engine_config.block_size
            old = list(self.replicas)
            self._start_decode_pool(len(old) if count is None else count)
            for waiting in old_pool.take_waiting() if old_pool is not None else []:
                self._hand_off(*waiting)  # to the new pool, or said in the stream if the split is gone
            for replica in old:
                self.retire(replica)
            for order in list(self.orders):
                self._cancel(order)
            pool, self.fleet_config.warm_pool = self.warm_pool, 0
            self._fill_pool()  # the old pool goes too
            self.set_replica_count(len(old) if count is None else count)
            self.fleet_config.warm_pool = pool
            for _ in range(pool):  # a rebuild restarts on machines already held: no provisioning
                self._start(self._spare_cores(), serve=False)

    def reconfigure(self, **changes: object) -> None:
        """Engine levers every replica takes in place (max_num_seqs, chunked_prefill, ...), the
        warm pool's too, so a promoted replica serves with the levers of the moment."""
        with self._lock:
            self.engine_config = self.engine_config.replace(**changes)
            for replica in self.replicas + self.warm:
                replica.reconfigure(**changes)
            if self.decode is not None:
                self.decode.reconfigure(**changes)

    # live view ----------------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[FleetSnapshot], None]) -> None:
        """callback(snapshot) SNAPSHOT_HZ times a second (the web layer's live charts)."""
        self._subscribers.append(callback)

    def publish_step(self) -> bool:
        """A driver's step, SNAPSHOT_HZ times a second: watch the replicas, then one snapshot to
        every subscriber. False once stopped."""
        if self._stopped:
            return False
        self.watch_once()
        if self._subscribers:
            snap = self.snapshot()
            for callback in list(self._subscribers):
                callback(snap)
        return True

    def watch_once(self) -> None:
        """Turn replica state changes into events, and forget retired replicas once stopped."""
        with self._lock:
            for replica in [r for r in self.warm if r.state in ENDED]:
                self.warm.remove(replica)
                self.retiring.append(replica)
            if self.decode is not None:
                self.retiring += self.decode.watch()  # failed ones replaced; stopped and forgotten below
                self.router.downstream = self.decode.replicas
            for replica in self.replicas + self.retiring + self.warm + self.downstream():
                if self._last_states.get(replica.replica_id) != replica.state:
                    self._last_states[replica.replica_id] = replica.state
                    if replica.state in ENDED:  # what was still on it will not finish
                        self.traces.replica_ended(replica.replica_id)
                    why = f": {replica.error}" if replica.state == ReplicaState.FAILED and replica.error else ""
                    where = " (warm pool)" if replica in self.warm else " (decode)" if replica in self.downstream() else ""
                    self.events.emit(
                        "replica",
                        f"replica {replica.replica_id} {replica.state}{why}{where}",
                        replica=replica.replica_id,
                        state=replica.state,
                    )
            self._note_unservable()
            now = self.clock.now()
            for replica in [r for r in self.replicas if r.state == ReplicaState.FAILED]:
                # A failed replica (or shard group) stays on the charts a while, then leaves the set
                # whole; the autoscaler sees the lost capacity and orders a fresh one.
                failed_at = self._failed_at.setdefault(replica.replica_id, now)
                replaced = any(r.state in SERVING for r in self.replicas)
                if now - failed_at >= FAILED_SHOWN_S and replaced:  # the last one stays: the router fails its queue
                    self.replicas.remove(replica)
                    self.router.set_replicas(self.replicas)
                    self.retiring.append(replica)
            for replica in [r for r in self.retiring if r.state in ENDED]:
                self._failed_at.pop(replica.replica_id, None)
                self.retiring.remove(replica)
                replica.stop()
                self.bus.forget(replica.replica_id)
                self._last_states.pop(replica.replica_id, None)
                self._cores.pop(replica.replica_id, None)

    def wait_ready(self, timeout: float = 300.0) -> bool:
        return all(r.wait_ready(timeout) for r in list(self.replicas))

    @property
    def engine_plan(self) -> EnginePlan | None:
        """What the replicas run on this machine and why (the first that said so)."""
        for replica in self.replicas + self.warm + self.retiring:
            plan = getattr(replica, "plan", None)
            if plan is not None:
                return plan
        return None

    @property
    def ready(self) -> bool:
        return not self.draining and any(r.state == ReplicaState.READY for r in self.replicas)

    def has_work(self) -> bool:
        """A request in the central queue or on any replica (handed over, waiting or running):
        background measurements stay paused while one is (engine/launch/yielding.py)."""
        with self._lock:
            replicas = self.replicas + self.retiring + self.downstream()
        return len(self.router.queue) > 0 or any(r.num_in_flight > 0 for r in replicas)

    def replica_states(self) -> dict[str, int]:
        """Serving replicas by state; retiring ones as "draining" until they stop (even one retired
        while loading, so it never counts as capacity); the pool as "warm" (loaded) or "warming";
        serving orders still waiting for their machine as "provisioning"."""
        with self._lock:
            names: list[str] = [r.state for r in self.replicas + self.downstream()]
            names += [ReplicaState.DRAINING if r.state in SERVING else r.state for r in self.retiring]
            names += [POOL_NAMES.get(r.state, r.state) for r in self.warm]
            names += [PoolState.WARMING if o.pool else PoolState.PROVISIONING for o in self.orders]
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
        priority: int = 0,
        user: str | None = None,
    ) -> queue.Queue:
        """user: the OpenAI `user` tag (at most MAX_USER_LENGTH characters), kept on its trace row."""
        if self.draining:
            raise AdmissionError(503, "draining", "the server is shutting down")
        if not self.ready:
            raise AdmissionError(503, "not_ready", "no replica is ready")
        return self.router.submit(request_id, prompt_token_ids, params, api_key, events, priority, user)

    def metrics_text(self) -> str:
        text = self.bus.prometheus_text(
            self.model_name, len(self.router.queue), self.router.rejected, self.replica_states()
        )
        return text + "\n".join(self.scale_metrics_lines() + self.cache_info_lines()) + "\n"

    def cache_info_lines(self) -> list[str]:
        """vLLM's info gauge of the KV cache's shape, one series per replica (vLLM's engine):
        a dashboard, or a ServeLab lab pointed at this server (issue 17), reads the block size
        and block count from it."""
        config = self.engine_config
        plan = self.engine_plan  # "auto" resolved by the replicas
        dtype = plan.dtype if plan is not None else config.dtype
        lines = ["# TYPE vllm:cache_config_info gauge"]
        for replica_id, stats in sorted(dict(self.bus.replica_stats).items()):
            labels = (
                f'block_size="{config.block_size}",cache_dtype="{dtype}",'
                f'enable_prefix_caching="{config.prefix_caching}",engine="{replica_id}",'
                f'num_gpu_blocks="{stats.kv_total_blocks}"'
            )
            lines.append(f"vllm:cache_config_info{{{labels}}} 1")
        return lines

    def snapshot(self) -> FleetSnapshot:
        snap = self.bus.snapshot(len(self.router.queue), self.router.rejected, self.replica_states())
        # streams_cut_mid_stream, scale_changes_total, replicas_ordered_total; the central_queue row's metric
        return replace(snap, **self.scale_counts(), replica_queue_depths=self.router.replica_queue_depths())

    def stop(self) -> None:
        """Stop every replica; the fleet's steps end at their next run (its own threads at once)."""
        self._stopped = True
        self.router.close()
        with self._lock:
            for order in list(self.orders):
                self._cancel(order)
        for replica in self.replicas + self.retiring + self.warm:
            replica.stop()
        if self.decode is not None:
            self.decode.stop()
        if self._own_driver and isinstance(self.driver, WallClockDriver):
            self.driver.stop()
        self._drained.set()
