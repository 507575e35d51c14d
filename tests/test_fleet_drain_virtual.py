"""A drain on the virtual clock: the fleet's own step finishes it (it used to wait on wall time
while looping on its clock, which a virtual clock never moves on its own)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.serving.replicas.replica_api import ReplicaState
from engine.serving.routing.router import AdmissionError, RouterConfig
from engine.serving.scaling.fleet import Fleet
from engine.serving.scaling.fleet_config import FleetConfig
from engine.sim.loop import EventLoop
from engine.sim.replica import SimReplica
from engine.sim.runner import sim_executor
from engine.sim.spec import SimSpec

pytestmark = pytest.mark.integration


def virtual_fleet(drain_timeout_s: float) -> tuple[Fleet, EventLoop, list[Any]]:
    spec = SimSpec(model="llama-3.1-8b", device="h100", gpus=1, num_requests=4)
    dep, config = spec.deployment(), spec.engine_config()
    loop = EventLoop()
    finished: list[Any] = []

    def new_replica(replica_id: int, cfg: EngineConfig, cores: Any = None, on_message: Any = None) -> SimReplica:
        engine = LLMEngine(cfg, loop.clock, sim_executor(dep, cfg))
        return SimReplica(replica_id, engine, loop, finished.append, on_message=on_message, record_steps=False)

    fleet = Fleet(config, RouterConfig(queue_cap=16), FleetConfig(1, drain_timeout_s=drain_timeout_s), new_replica,
                  loop.clock, driver=loop, model=(dep.model.name, dep.model.cfg.max_position))  # fmt: skip
    return fleet, loop, finished


def test_a_drain_on_the_virtual_clock_finishes_the_work_in_flight_then_stops() -> None:
    fleet, loop, finished = virtual_fleet(drain_timeout_s=600.0)
    params = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)
    for i in range(3):
        fleet.submit(f"r{i}", [7] * 100, params, None)
    loop.run(until=0.05)  # the three are running
    fleet.begin_drain()
    with pytest.raises(AdmissionError) as refused:
        fleet.submit("late", [7] * 100, params, None)
    assert refused.value.status == 503 and refused.value.reason == "draining"
    loop.run(until=600.0, done=lambda: fleet.drained)
    assert fleet.drained
    assert sorted(s.request_id for s in finished) == ["r0", "r1", "r2"]
    assert all(len(s.output_token_ids) == 500 and s.finish_reason == "length" for s in finished)
    assert loop.clock.now() < 600.0  # stopped when the work was done, not at the deadline
    assert {r.state for r in fleet.replicas} == {ReplicaState.STOPPED}


def test_a_drain_past_its_deadline_stops_with_work_still_running() -> None:
    fleet, loop, finished = virtual_fleet(drain_timeout_s=0.5)
    fleet.submit("long", [7] * 100, SamplingParams(temperature=0, max_tokens=100_000, ignore_eos=True), None)
    loop.run(until=0.05)
    fleet.begin_drain()
    loop.run(until=60.0, done=lambda: fleet.drained)
    assert fleet.drained and 0.5 <= loop.clock.now() < 1.0
    assert not [s for s in finished if s.finish_reason == "length"]  # cut off, not completed
