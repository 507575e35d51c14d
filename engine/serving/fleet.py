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
from engine.serving.metrics import MetricsBus
from engine.serving.replica import ReplicaHandle
from engine.serving.router import AdmissionError, Router, RouterConfig

log = logging.getLogger("servelab.fleet")

SNAPSHOT_HZ = 5.0


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
    def __init__(self, engine_config: EngineConfig, router_config: RouterConfig, fleet_config: FleetConfig) -> None:
        path = engine_config.model or str(default_gguf_path())
        self.model_name = DEFAULT_MODEL_NAME if engine_config.model is None else Path(path).stem
        self.tokenizer: ChatTokenizer = load_tokenizer(path)
        self.engine_config = engine_config
        self.fleet_config = fleet_config
        self.bus = MetricsBus()
        self.replicas = [
            ReplicaHandle(i, engine_config, cores=cores, on_message=self.bus.observe)
            for i, cores in enumerate(split_cores(fleet_config.replicas))
        ]
        router_config.block_size = engine_config.block_size
        context = context_length(Path(path))
        router_config.max_model_len = min(engine_config.max_model_len or context, context)
        self.router = Router(self.replicas, router_config)
        self.draining = False
        self._drained = threading.Event()
        self._subscribers: list[Callable[[dict], None]] = []
        threading.Thread(target=self._publish, name="snapshots", daemon=True).start()

    def subscribe(self, callback: Callable[[dict], None]) -> None:
        """callback(snapshot) SNAPSHOT_HZ times a second (the web layer's live charts)."""
        self._subscribers.append(callback)

    def _publish(self) -> None:
        while not self._drained.wait(1.0 / SNAPSHOT_HZ):
            if self._subscribers:
                snap = self.snapshot()
                for callback in list(self._subscribers):
                    callback(snap)

    def wait_ready(self, timeout: float = 300.0) -> bool:
        return all(r.wait_ready(timeout) for r in self.replicas)

    @property
    def ready(self) -> bool:
        return not self.draining and any(r.state == "ready" for r in self.replicas)

    def replica_states(self) -> dict[str, int]:
        states: dict[str, int] = {}
        for replica in self.replicas:
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
        return self.bus.snapshot(len(self.router.queue), self.router.rejected)

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
        while WALL_CLOCK.now() < deadline and any(r.state == "draining" for r in self.replicas):
            pause.wait(0.05)
        self.stop()

    def stop(self) -> None:
        self.router.close()
        for replica in self.replicas:
            replica.stop()
        self._drained.set()
