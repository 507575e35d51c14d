"""The same router tests over both kinds of replica behind the same Fleet: live replica processes
(a real model on this machine's cores, the fleet's default factory and WallClockDriver) and
simulated ones (the engine's own LLMEngine with the cost model, made by a factory, the fleet's
steps on the EventLoop's VirtualClock). Only how time passes differs: live tests wait on the
streams, simulated ones run the event loop until the streams have answered."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

import pytest

from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.serving.replicas.messages import RequestError
from engine.serving.replicas.replica import ReplicaHandle
from engine.serving.replicas.replica_api import ReplicaState
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from engine.sim.deployment import Deployment
from engine.sim.devices import get_device
from engine.sim.loop import EventLoop
from engine.sim.models import get_model
from engine.sim.replica import SimReplica
from engine.sim.runner import sim_executor

pytestmark = pytest.mark.integration

SHORT = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
CONFIG = EngineConfig(dtype="bfloat16", max_num_seqs=2)


def router_config() -> RouterConfig:
    return RouterConfig(queue_cap=16, deadline_s=None)


class Live:
    def __init__(self) -> None:
        self.fleet = Fleet(CONFIG, router_config(), FleetConfig(replicas=2))
        assert self.fleet.wait_ready(), self.fleet.replica_states()
        self.router = self.fleet.router
        self.replicas = list(self.fleet.replicas)

    def wait(self, cond: Callable[[], bool], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.02)

    def kill(self, replica: ReplicaHandle) -> None:
        replica.process.kill()

    def close(self) -> None:
        self.fleet.stop()


class Sim:
    def __init__(self) -> None:
        self.loop = EventLoop()
        dep = Deployment(get_model("smollm2-135m"), get_device("l4"))
        clock = self.loop.clock

        def new_replica(replica_id: int, config: EngineConfig, **kw: object) -> SimReplica:
            engine = LLMEngine(config, clock, sim_executor(dep, config))
            return SimReplica(replica_id, engine, self.loop, lambda seq: None, on_message=kw.get("on_message"))  # type: ignore[arg-type]

        model = (dep.model.name, dep.model.cfg.max_position)
        self.fleet = Fleet(CONFIG, router_config(), FleetConfig(replicas=2), new_replica, clock, self.loop, model)
        self.router = self.fleet.router
        self.replicas = list(self.fleet.replicas)

    def wait(self, cond: Callable[[], bool], timeout: float = 600.0) -> None:
        self.loop.run(until=self.loop.clock.now() + timeout, done=cond)
        assert cond(), "timed out in simulated time"

    def kill(self, replica: SimReplica) -> None:
        replica.fail(f"replica {replica.replica_id} died")

    def close(self) -> None:
        self.fleet.stop()


@pytest.fixture(params=[Live, Sim], ids=["live", "sim"])
def kind(request: pytest.FixtureRequest):
    k = request.param()
    yield k
    k.close()


def outcome(kind: Live | Sim, events: queue.Queue) -> list:
    got: list = []

    def ended() -> bool:
        while not events.empty():
            got.append(events.get_nowait())
        return bool(got) and (isinstance(got[-1], RequestError) or got[-1].finished)

    kind.wait(ended)
    return got


def test_dispatch_only_to_room_then_everything_finishes(kind):
    streams = [kind.router.submit(f"room-{i}", [100 + i] * 20, SHORT) for i in range(6)]
    kind.wait(lambda: len(kind.router.queue) <= 2)
    assert all(r.num_in_flight <= 2 for r in kind.replicas)  # 2 slots each: the rest wait centrally
    assert all(outcome(kind, s)[-1].finish_reason == "length" for s in streams)
    kind.wait(lambda: all(r.stats.kv_used_blocks == 0 and r.stats.running == 0 for r in kind.replicas))


def test_shared_prefix_goes_to_the_replica_that_caches_it(kind):
    preamble = list(range(1000, 1064))  # four full blocks
    assert outcome(kind, kind.router.submit("pre-0", preamble + [5, 6, 7], SHORT))[-1].num_cached_tokens == 0
    for i in range(1, 4):
        assert outcome(kind, kind.router.submit(f"pre-{i}", preamble + [8 + i], SHORT))[-1].num_cached_tokens == 64


def test_a_draining_replica_finishes_its_residents_and_gets_nothing_new(kind):
    first, second = kind.replicas
    resident = kind.router.submit("resident", [300] * 20, LONG)
    kind.wait(lambda: first.num_in_flight + second.num_in_flight == 1)
    holder = first if first.num_in_flight else second
    other = second if holder is first else first
    kind.fleet.retire(holder)  # scale-in: the fleet takes it from the router, then it drains
    late = [kind.router.submit(f"late-{i}", [400 + i] * 20, SHORT) for i in range(2)]
    kind.wait(lambda: len(kind.router.queue) == 0)
    assert holder.num_in_flight == 1 and other.num_in_flight == 2
    assert outcome(kind, resident)[-1].finish_reason == "length"  # no stream is cut
    assert all(outcome(kind, s)[-1].finish_reason == "length" for s in late)
    kind.wait(lambda: holder.state == ReplicaState.STOPPED)


def test_a_failed_replica_fails_its_requests_and_the_router_moves_on(kind):
    first, second = kind.replicas
    doomed = kind.router.submit("doomed", [500] * 20, LONG)
    kind.wait(lambda: first.num_in_flight + second.num_in_flight == 1)
    victim = first if first.num_in_flight else second
    kind.kill(victim)
    got = outcome(kind, doomed)
    assert isinstance(got[-1], RequestError)
    kind.wait(lambda: victim.state == ReplicaState.FAILED)
    after = [kind.router.submit(f"after-{i}", [600 + i] * 20, SHORT) for i in range(3)]
    assert all(outcome(kind, s)[-1].finish_reason == "length" for s in after)
    assert victim.num_in_flight == 0
    kind.wait(lambda: victim not in kind.fleet.replicas)  # shown a while, then it leaves the set
    assert victim not in kind.router.replicas
