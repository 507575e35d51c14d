"""The fleet in-process: live snapshots at least 5 a second while a request runs, then a drain that
lets the request finish and stops every replica."""

from __future__ import annotations

import threading
import time

import pytest

from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.serving.replicas.messages import TokenDelta
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from engine.serving.telemetry.snapshot import FleetSnapshot

pytestmark = pytest.mark.integration


def test_snapshots_stream_and_drain_finishes_in_flight_work() -> None:
    fleet = Fleet(EngineConfig(), RouterConfig(), FleetConfig(replicas=1, drain_timeout_s=60))
    try:
        assert fleet.wait_ready() and fleet.ready
        snapshots: list[FleetSnapshot] = []
        fleet.subscribe(snapshots.append)
        events = fleet.submit("live-1", [500] * 40, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), None)
        deadline = time.monotonic() + 30  # a busy machine may be slow to run the first step
        while not any(s.running == 1 for s in snapshots) and time.monotonic() < deadline:
            time.sleep(0.05)
        before = len(snapshots)
        time.sleep(1.0)
        assert len(snapshots) - before >= 5  # the live stream's promise: at least 5 a second
        assert {"time", "queue_depth", "running", "kv_used_blocks", "ttft_p99", "tokens_per_s", "replicas"} <= set(
            snapshots[-1].to_json()
        )
        assert any(s.running == 1 for s in snapshots)
        drainer = threading.Thread(target=fleet.drain_and_stop)
        drainer.start()
        tokens = 0
        while True:
            event = events.get(timeout=60)
            assert isinstance(event, TokenDelta), event
            tokens += len(event.token_ids)
            if event.finished:
                break
        assert tokens == 40
        drainer.join(60)
        assert all(not r.process.is_alive() for r in fleet.replicas)
        assert fleet.replica_states() == {"stopped": 1}
    finally:
        fleet.stop()
