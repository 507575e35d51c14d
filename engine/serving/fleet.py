"""The fleet: the replicas, the router in front of them, the metrics bus, and the server's
lifecycle (ready, draining, stopped). What the API layer talks to; it holds no model itself,
only the tokenizer, so the front process stays light."""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.clock import WALL_CLOCK
from engine.config import EngineConfig
from engine.model.gguf_file import context_length
from engine.model.paths import DEFAULT_MODEL_NAME, default_gguf_path
from engine.model.tokenizer import ChatTokenizer, load_tokenizer
from engine.sampling_params import SamplingParams
from engine.serving.events import EventLog
from engine.serving.metrics import MetricsBus
from engine.serving.replica import ReplicaHandle
from engine.serving.router import AdmissionError, Router, RouterConfig

log = logging.getLogger("servelab.fleet")

SNAPSHOT_HZ = 6.0  # the live stream promises at least 5 a second


@dataclass
class FleetConfig:
    replicas: int = 1
    drain_timeout_s: float = 30.0


def split_cores(num_replicas: int) -> list[list[int]]:
    """Each replica gets its share of this process's cores (they share when there are fewer)."""
    cores = sorted(os.sched_getaffinity(0))
    if num_replicas >= len(cores):
        return [[cores[i % len(cores)]] for i in range(num_replicas)]
    per = len(cores) // num_replicas
    return [cores[i * per : (i + 1) * per] for i in range(num_replicas)]


class Fleet:
    """Replicas come and go while it serves: rebuilt when a lever needs it, added and retired by
    the autoscaler. A retired replica drains (finishes its residents) before it stops."""

    def __init__(self, engine_config: EngineConfig, router_config: RouterConfig, fleet_config: FleetConfig) -> None:
        path = engine_config.model or str(default_gguf_path())
        self.model_name = DEFAULT_MODEL_NAME if engine_config.model is None else Path(path).stem
        self.tokenizer: ChatTokenizer = load_tokenizer(path)
        self.engine_config = engine_config
        self.fleet_config = fleet_config
        self.events = EventLog()
        self.bus = MetricsBus(events=self.events)
        router_config.block_size = engine_config.block_size
        self.context_length = context_length(Path(path))
        router_config.max_model_len = min(engine_config.max_model_len or self.context_length, self.context_length)
        self.router = Router([], router_config, events=self.events)
        self.replicas: list[ReplicaHandle] = []  # serving, or starting to
        self.retiring: list[ReplicaHandle] = []  # draining: no new work, finishing their residents
        self._next_id = 0
        self._lock = threading.RLock()
        self._last_states: dict[int, str] = {}
        self.set_replica_count(fleet_config.replicas)
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

    def _start(self, cores: list[int]) -> ReplicaHandle:
        replica = ReplicaHandle(self._next_id, self.engine_config, cores=cores, on_message=self.bus.observe)
        self._next_id += 1
        self.replicas.append(replica)
        self.router.set_replicas(self.replicas)
        return replica

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
            self.set_replica_count(len(old) if count is None else count)

    def reconfigure(self, **changes: object) -> None:
        """Engine levers every replica takes in place (max_num_seqs, chunked_prefill, ...)."""
        with self._lock:
            self.engine_config = self.engine_config.replace(**changes)
            for replica in self.replicas:
                replica.reconfigure(**changes)

    # live view ----------------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[dict], None]) -> None:
        """callback(snapshot) SNAPSHOT_HZ times a second (the web layer's live charts)."""
        self._subscribers.append(callback)

    def _publish(self) -> None:
        period, due = 1.0 / SNAPSHOT_HZ, WALL_CLOCK.now()
        while not self._drained.wait(max(0.0, (due := due + period) - WALL_CLOCK.now())):
            self._watch_replicas()
            if self._subscribers:
                snap = self.snapshot()
                for callback in list(self._subscribers):
                    callback(snap)

    def _watch_replicas(self) -> None:
        """Turn replica state changes into events, and forget retired replicas once stopped."""
        with self._lock:
            for replica in self.replicas + self.retiring:
                if self._last_states.get(replica.replica_id) != replica.state:
                    self._last_states[replica.replica_id] = replica.state
                    why = f": {replica.error}" if replica.state == "failed" and replica.error else ""
                    self.events.emit(
                        "replica",
                        f"replica {replica.replica_id} {replica.state}{why}",
                        replica=replica.replica_id,
                        state=replica.state,
                    )
            for replica in [r for r in self.retiring if r.state in ("stopped", "failed")]:
                self.retiring.remove(replica)
                replica.stop()
                self.bus.forget(replica.replica_id)
                self._last_states.pop(replica.replica_id, None)

    def wait_ready(self, timeout: float = 300.0) -> bool:
        return all(r.wait_ready(timeout) for r in list(self.replicas))

    @property
    def ready(self) -> bool:
        return not self.draining and any(r.state == "ready" for r in self.replicas)

    def replica_states(self) -> dict[str, int]:
        states: dict[str, int] = {}
        for replica in self.replicas + self.retiring:
            states[replica.state] = states.get(replica.state, 0) + 1
        return states

    def submit(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, api_key: str | None
    ) -> queue.Queue:
        if self.draining:
            raise AdmissionError(503, "draining", "the server is shutting down")
        if not self.ready:
            raise AdmissionError(503, "not_ready", "no replica is ready")
        return self.router.submit(request_id, prompt_token_ids, params, api_key)

    def metrics_text(self) -> str:
        return self.bus.prometheus_text(self.model_name, len(self.router.queue), self.router.rejected)

    def snapshot(self) -> dict:
        snap = self.bus.snapshot(len(self.router.queue), self.router.rejected)
        snap["replicas"] = self.replica_states()
        return snap

    # shutdown -----------------------------------------------------------------------------------

    def drain_and_stop(self) -> None:
        """SIGTERM: refuse new work at once, let in-flight requests finish (up to drain_timeout_s),
        then stop every replica process."""
        self.draining = True
        deadline = WALL_CLOCK.now() + self.fleet_config.drain_timeout_s
        pause = threading.Event()
        while WALL_CLOCK.now() < deadline and len(self.router.queue):  # queued work still goes out
            pause.wait(0.05)
        for replica in self.replicas:
            replica.drain()
        while WALL_CLOCK.now() < deadline and any(r.state == "draining" for r in self.replicas + self.retiring):
            pause.wait(0.05)
        self.stop()

    def stop(self) -> None:
        self.router.close()
        for replica in self.replicas + self.retiring:
            replica.stop()
        self._drained.set()
