"""The fleet in-process: live snapshots at 5 a second while a request runs, then a drain that
lets the request finish and stops every replica."""

from __future__ import annotations

import threading
import time

from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.serving.fleet import Fleet, FleetConfig
from engine.serving.messages import TokenDelta
from engine.serving.router import RouterConfig


def test_snapshots_stream_and_drain_finishes_in_flight_work() -> None:
    fleet = Fleet(EngineConfig(dtype="bfloat16"), RouterConfig(), FleetConfig(replicas=1, drain_timeout_s=60))
    try:
        assert fleet.wait_ready() and fleet.ready
        snapshots: list[dict] = []
        fleet.subscribe(snapshots.append)
        events = fleet.submit("live-1", [500] * 40, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), None)
        time.sleep(1.1)
        assert len(snapshots) >= 5
        assert {"time", "queue_depth", "running", "kv_used_blocks", "ttft_p99", "tokens_per_s", "replicas"} <= set(
            snapshots[-1]
        )
        assert any(s["running"] == 1 for s in snapshots)
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
