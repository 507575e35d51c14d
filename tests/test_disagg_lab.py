"""The prefill/decode split as the lab's levers: prefill_gpus and decode_gpus rebuild the live
fleet into a prefill replica and a decode replica (one core each here), the lab's traffic is
served through the handoff, and the levers back at 0 make it colocated again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.errors import InvalidParamError
from engine.lab.live.lab import LiveLab
from engine.serving.replicas.replica_api import ReplicaState
from tests.support.live_lab import finished, running_lab
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

LEVERS = {
    "gpu_count": 2, "min_replicas": 1, "max_replicas": 2, "kv_budget_mb": 64, "provision_delay_s": 0.0,
    "request_rate": 0.5, "prompt_tokens": 150, "output_tokens": 24,
}  # fmt: skip


@pytest.fixture(scope="module")
def lab() -> Iterator[LiveLab]:
    with running_lab(LEVERS) as lab:
        yield lab


def test_the_split_levers_rebuild_the_fleet_and_the_traffic_flows_through_the_handoff(lab: LiveLab) -> None:
    with pytest.raises(InvalidParamError) as err:
        lab.set_levers({"prefill_gpus": 1})
    assert err.value.param == "prefill_gpus" and "both pools" in err.value.message
    change = lab.set_levers({"prefill_gpus": 1, "decode_gpus": 1})
    assert change.rebuild
    fleet = lab.fleet
    assert wait_for(lambda: fleet.decode is not None and fleet.ready and any(
        r.state == ReplicaState.READY for r in fleet.downstream()), 240)
    assert len([r for r in fleet.replicas if r.state == ReplicaState.READY]) == 1
    lab.flood("start")
    try:
        done = finished(lab)
        assert wait_for(lambda: finished(lab) >= done + 3, 180)
    finally:
        lab.flood("stop")
    assert fleet.decode is not None and fleet.decode.handoffs >= 3
    assert lab.traffic.counts.refused == 0
    lab.set_levers({"prefill_gpus": 0, "decode_gpus": 0})
    assert wait_for(lambda: fleet.decode is None and fleet.ready, 240)
    assert not fleet.downstream()
