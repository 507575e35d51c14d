"""The aging row through the whole serving stack, simulated (issue 15, part B): the real Fleet,
Router and Scheduler over SimReplicas on one EventLoop. The central queue is FIFO and hands a
replica work only when it has room, so a replica's own waiting line (where aging acts) only grows
with per-replica inboxes (central_queue off); a request's priority travels from Fleet.submit to
the replica's scheduler. With aging on the low-priority requests get the reserved slot once they
have waited starvation_s; off, they wait as long as ordinary requests keep arriving."""

from __future__ import annotations

import queue

import pytest

from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.serving.replicas.messages import TokenDelta
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling.fleet import Fleet, FleetConfig
from engine.sim.loop import EventLoop
from engine.sim.replica import SimReplica
from engine.sim.run import SimSpec
from engine.sim.runner import sim_executor
from tests.support.failure_traffic import prompt, ratio

pytestmark = pytest.mark.integration

TRAFFIC_S = 6.0  # simulated seconds of ordinary traffic
STARVATION_S = 0.5


def ttfts(aging: bool) -> tuple[list[float], list[float]]:
    """The ordinary requests' TTFTs and the low-priority ones', one simulated run."""
    dep = SimSpec("smollm2-135m", "cpu", 2).deployment()
    loop = EventLoop()
    clock = loop.clock
    config = EngineConfig(max_num_seqs=2, starvation_s=STARVATION_S, aging=aging, prefix_caching=False)
    replicas: list[SimReplica] = []

    def new_replica(replica_id: int, cfg: EngineConfig, cores: object = None, on_message: object = None) -> SimReplica:
        replica = SimReplica(replica_id, LLMEngine(cfg, clock, sim_executor(dep, cfg)), loop, lambda s: None)
        replicas.append(replica)
        return replica

    fleet = Fleet(
        config,
        RouterConfig(queue_cap=10_000, deadline_s=None),
        FleetConfig(2),
        new_replica,
        clock,
        driver=loop,
        model=(dep.model.name, dep.model.cfg.max_position),
    )
    fleet.defences.update(central_queue=False)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    streams: dict[str, tuple[int, queue.Queue]] = {}

    def submit(request_id: str, priority: int) -> None:
        events = fleet.submit(request_id, prompt(len(streams), 32), params, None, priority=priority)
        streams[request_id] = (priority, events)

    for i in range(2):  # one on each replica (round robin)
        submit(f"low-{i}", 10)

    def top_up() -> bool:
        """More ordinary waiters than free slots on every replica, for TRAFFIC_S."""
        while min(sum(s.priority == 0 for s in r.engine.scheduler.waiting) for r in replicas) < 3:
            submit(f"ordinary-{len(streams)}", 0)
            fleet.router.dispatch_once()
        return clock.now() < TRAFFIC_S

    loop.every(0.005, top_up)
    loop.run(done=lambda: clock.now() > TRAFFIC_S and not any(r.engine.has_work() for r in replicas))
    fleet.stop()
    assert all(r.engine.kv.num_used_blocks == 0 for r in replicas)
    ordinary, low = [], []
    for priority, events in streams.values():
        delta = events.get_nowait()
        assert isinstance(delta, TokenDelta) and delta.finished and delta.times is not None
        (low if priority else ordinary).append(delta.times.ttft or 0.0)
    return ordinary, low


def test_aging_off_starves_low_priority_behind_per_replica_inboxes() -> None:
    fair_ordinary, fair_low = ttfts(aging=True)
    unfair_ordinary, unfair_low = ttfts(aging=False)
    assert len(unfair_ordinary) >= 100
    assert max(fair_low) <= 2 * STARVATION_S + 0.5  # the reserved slot, soon after the bound
    assert ratio(min(unfair_low), TRAFFIC_S) >= 0.95  # off: only once the ordinary traffic stopped
    assert ratio(max(unfair_ordinary + unfair_low), max(fair_ordinary + fair_low)) >= 3
    median = sorted(unfair_ordinary)[len(unfair_ordinary) // 2]
    assert ratio(median, sorted(fair_ordinary)[len(fair_ordinary) // 2]) <= 1.5  # the median looks fine
