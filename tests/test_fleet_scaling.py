"""The fleet's scaling bookkeeping with stand-in replicas (no processes): the warm pool promotes at
once, a cold start waits provision_delay_s, scale-in cancels an order before it drains anyone,
and a drain picks the replica with the least on it."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.serving.routing.router import RouterConfig
from engine.serving.scaling import fleet as fleet_module
from engine.serving.scaling.fleet import Fleet, FleetConfig
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


class StandIn:
    """What the fleet uses of a ReplicaHandle; the test moves its state by hand."""

    def __init__(self, replica_id: int, config: EngineConfig, cores: list[int] | None = None, **kw: Any) -> None:
        self.replica_id, self.config, self.cores = replica_id, config, cores
        self.on_message = kw.get("on_message")
        self.state, self.stats, self.error, self.num_in_flight = "starting", None, None, 0
        self.process = SimpleNamespace(is_alive=lambda: False)

    def drain(self) -> None:
        if self.state == "ready":  # as the real handle: a loading one stops once loaded
            self.state = "draining"

    def stop(self, timeout: float = 10.0) -> None:
        self.state = "stopped"

    def wait_ready(self, timeout: float = 120.0) -> bool:
        return self.state == "ready"

    def abort(self, request_id: str) -> None:
        pass


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> Fleet:
    monkeypatch.setattr(fleet_module, "load_tokenizer", lambda path: None)  # no model is read at all
    monkeypatch.setattr(fleet_module, "context_length", lambda path: 2048)
    fleet = Fleet(EngineConfig(), RouterConfig(), FleetConfig(replicas=1, warm_pool=1, provision_delay_s=0.3), StandIn)
    yield fleet
    fleet.stop()


def test_warm_pool_promotes_at_once_and_cold_starts_wait_for_their_machine(fleet: Fleet) -> None:
    assert fleet.replica_states() == {"starting": 1, "warming": 1}
    assert fleet.warm[0].on_message is None  # an idle pool replica does not dilute the fleet's metrics
    for replica in fleet.replicas + fleet.warm:
        replica.state = "ready"
    assert fleet.replica_states() == {"ready": 1, "warm": 1}

    promoted = fleet.warm[0]
    assert "from the warm pool" in fleet.scale_up()
    assert fleet.replica_states() == {"ready": 2, "warming": 1}  # promoted; the pool refills behind it
    assert promoted in fleet.router.replicas and promoted.on_message == fleet.observe_replica

    assert "cold start: 0.3 s to provision" in fleet.scale_up()
    assert fleet.replica_states() == {"ready": 2, "provisioning": 1, "warming": 1}
    assert fleet.scale_down() == "cancelled a replica still provisioning"
    assert fleet.replica_states() == {"ready": 2, "warming": 1}
    time.sleep(0.5)
    assert len(fleet.replicas) == 2  # the cancelled order never started anything

    assert wait_for(lambda: len(fleet.warm) == 1)  # the refill's machine came: it is loading
    assert "from the warm pool" in fleet.scale_up()  # a loading pool replica is further along than a cold start
    assert fleet.replica_states() == {"ready": 2, "starting": 1, "warming": 1}
    assert wait_for(lambda: len(fleet.warm) == 1)


def test_scale_down_drains_the_least_loaded_and_the_pool_shrinks(fleet: Fleet) -> None:
    fleet.set_warm_pool(0)
    assert fleet.warm == [] and fleet.replica_states() == {"starting": 1, "draining": 1}
    fleet.set_provision_delay(0.0)
    fleet.scale_up(2)
    assert wait_for(lambda: len(fleet.replicas) == 3)
    busy, light, loading = fleet.replicas
    busy.state, light.state = "ready", "ready"
    busy.num_in_flight, light.num_in_flight = 3, 1
    assert fleet.scale_down() == f"draining replica {loading.replica_id}, 0 request(s) still on it"
    assert loading.state == "starting" and fleet.replica_states()["draining"] == 2  # not counted as capacity
    assert fleet.scale_down() == f"draining replica {light.replica_id}, 1 request(s) still on it"
    assert fleet.replicas == [busy] and fleet.router.replicas == [busy]
    assert light in fleet.retiring and light.state == "draining"
    light.state = "stopped"  # its residents finished: the fleet forgets it
    assert wait_for(lambda: light not in fleet.retiring)


def test_a_rebuild_replaces_the_pool_without_provisioning(fleet: Fleet) -> None:
    old = fleet.warm[0]
    fleet.set_warm_pool(2)  # one loaded (or loading), one ordered
    assert len(fleet.orders) == 1
    fleet.rebuild(EngineConfig(block_size=32))
    assert fleet.orders == [] and old in fleet.retiring and len(fleet.warm) == 2
    assert all(r.config.block_size == 32 for r in fleet.warm + fleet.replicas)
