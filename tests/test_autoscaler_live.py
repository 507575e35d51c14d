"""The autoscaler over real replica processes: under the load generator the fleet scales 1 -> 2
-> 1, and not one request fails or is cut (the replica scaled in drains its residents first).
The second replica comes from the warm pool, loaded beside the first; the pool's refill waits on
a long provisioning delay and is cancelled at the end, so no third model load slows the test."""

from __future__ import annotations

import threading
import time

import pytest

from engine.config import EngineConfig
from engine.serving.load.loadgen import RequestRecord, RouterTarget, make_requests, run_load
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling.autoscaler import Autoscaler, AutoscalerConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from tests.support.server_process import kv_budget_mb
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

FAST = AutoscalerConfig(
    min_replicas=1,
    max_replicas=2,
    warm_pool=1,
    provision_delay_s=600.0,  # the pool's refill never gets its machine here: no third load
    up_window_s=1.0,
    down_window_s=4.0,
    queue_high=2,  # per ready replica
    queue_low=1,  # a request between dispatch polls does not break the calm
    slot_low=0.6,
    kv_low=1.0,
    tick_s=0.25,
)


def test_scales_one_two_one_under_load_without_a_failed_or_cut_request() -> None:
    engine = EngineConfig(kv_budget_mb=float(kv_budget_mb(64)), max_num_seqs=4)  # dtype auto, as `make run`
    fleet = Fleet(engine, RouterConfig(queue_cap=256, deadline_s=None), FleetConfig(replicas=1, warm_pool=1))
    auto = Autoscaler(fleet, FAST)
    records: list[RequestRecord] = []
    stop = threading.Event()
    try:
        assert fleet.wait_ready(), fleet.replica_states()
        assert wait_for(lambda: fleet.replica_states().get("warm") == 1, 120), fleet.replica_states()
        ready_seen: list[int] = []
        fleet.subscribe(lambda snap: ready_seen.append(snap.replicas.get("ready", 0)))
        auto.start()
        target = RouterTarget(fleet.router)
        deadline, batch = time.monotonic() + 150, 0
        # Bursts queue up until the second replica has served. The snapshots, not the state after
        # the burst, say so: on a loaded machine the burst's tail can outlast the calm window.
        while 2 not in ready_seen and time.monotonic() < deadline:
            records += run_load(target, make_requests(16, 24, 32, seed=batch), [0.0] * 16, max_duration_s=120)
            batch += 1
        assert 2 in ready_seen, fleet.events.recent("scale")

        def client(seed: int) -> None:  # one request at a time: calm enough to scale in, never idle
            for i in range(1000):
                if stop.is_set():
                    return
                records.extend(run_load(target, make_requests(1, 24, 24, seed=seed + i), [0.0], max_duration_s=120))

        clients = [threading.Thread(target=client, args=(seed,)) for seed in (1000, 2000)]
        for thread in clients:
            thread.start()
        calm = {"ready": 1, "warming": 1}  # the pool's refill is still provisioning
        assert wait_for(lambda: fleet.replica_states() == calm, 90), fleet.events.recent("scale")
        stop.set()
        for thread in clients:
            thread.join(120)
        scaled = [e for e in fleet.events.recent("scale") if e["delta"]]
        assert [e["delta"] for e in scaled] == [1, -1], scaled
        assert "from the warm pool" in scaled[0]["message"] and "draining replica" in scaled[1]["message"]
        assert 2 in ready_seen and ready_seen[-1] == 1
        assert records and all(r.status == "ok" and r.output_tokens == r.max_tokens for r in records), [
            (r.request_id, r.status, r.error) for r in records if r.status != "ok"
        ]
    finally:
        stop.set()
        auto.stop()
        fleet.stop()
    assert all(not r.process.is_alive() for r in fleet.replicas + fleet.retiring + fleet.warm)
