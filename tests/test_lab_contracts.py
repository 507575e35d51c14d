"""The lab floor's shared parts, once each: the flood (its controls, limits and events over any
traffic), the replica bounds of a device budget, and the lever -> simulator mapping that the
simulated lab, predict-then-run and A/B all build their SimSpec through."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from engine.errors import InvalidParamError
from engine.lab.flood import FloodLimits, FloodState, flood
from engine.lab.replica_bounds import replica_bounds
from engine.lab.simulated.lab_check import sim_spec
from engine.lab.simulated.predict import live_spec
from engine.levers import LEVERS
from engine.serving.telemetry.events import EventLog
from engine.sim.compare import parse_experiment
from engine.sim.spec import LEVER_FIELDS, SimSpec, spec_fields

pytestmark = pytest.mark.unit

DEFAULTS = {key: lever.default for key, lever in LEVERS.items()}


@dataclass
class FakeTraffic:
    """A FloodSource that only records what the flood asked of it."""

    lever_rate: float = 2.0
    running: bool = False
    sent: int = 0
    refused: int = 0
    calls: list[tuple] = field(default_factory=list)

    def current_rate(self) -> float:
        return self.lever_rate

    def start(self, ramp_to: float | None, ramp_s: float) -> None:
        self.running = True
        self.calls.append(("start", ramp_to, ramp_s))

    def stop(self) -> None:
        self.running = False
        self.calls.append(("stop",))


def test_the_flood_starts_ramps_and_stops_any_traffic_and_says_so() -> None:
    traffic, events = FakeTraffic(sent=7, refused=1), EventLog()
    limits = FloodLimits(most_rate=50.0, longest_ramp_s=600.0)
    assert flood(traffic, "start", None, 30.0, limits, events) == FloodState(True, 2.0, 7, 1)
    flood(traffic, "ramp", 40, 10, limits, events, "simulated ")
    stopped = flood(traffic, "stop", None, 30.0, limits, events)
    assert stopped.to_json() == {"running": False, "rate": 0.0, "sent": 7, "refused": 1}
    assert traffic.calls == [("start", None, 30.0), ("start", 40.0, 10.0), ("stop",)]
    assert [e["message"] for e in events.recent("flood")][-3:] == [
        "traffic on: sending 2 req/s", "simulated traffic on: ramping to 40 req/s over 10 s", "traffic stopped",
    ]


@pytest.mark.parametrize(
    ("action", "to", "over", "param"),
    [("go", None, 30.0, "action"), ("ramp", 51, 10, "to"), ("ramp", True, 10, "to"), ("ramp", 0, 10, "to"),
     ("ramp", 10, 601, "over_s"), ("ramp", 10, "soon", "over_s")],
)  # fmt: skip
def test_a_bad_flood_control_names_its_field_and_changes_nothing(action: str, to: object, over: object, param: str) -> None:
    traffic = FakeTraffic()
    with pytest.raises(InvalidParamError) as err:
        flood(traffic, action, to, over, FloodLimits(50.0), EventLog())
    assert err.value.param == param and traffic.calls == []


def test_replica_bounds_hold_a_warm_pool_out_of_a_gpu_budget_but_beside_shared_cores() -> None:
    levers = DEFAULTS | {"gpu_count": 8, "tensor_parallel": 2, "min_replicas": 1, "max_replicas": 8, "warm_pool": 1}
    assert replica_bounds(levers, warm_pool_holds_devices=True) == (1, 3)  # 4 TP groups, one warm
    assert replica_bounds(levers, warm_pool_holds_devices=False) == (1, 4)
    assert replica_bounds(levers | {"min_replicas": 9}, warm_pool_holds_devices=False) == (4, 4)
    assert replica_bounds(levers | {"gpu_count": 1}, warm_pool_holds_devices=True) == (1, 1)  # never below one


def test_every_lever_the_simulator_reads_goes_through_one_table() -> None:
    spec_names = set(SimSpec.__dataclass_fields__)
    assert set(LEVER_FIELDS.values()) <= spec_names
    fields = spec_fields({"gpu_count": 8.0, "tensor_parallel": 2, "request_rate": 3, "prefill_gpus": 0,
                          "decode_gpus": 0, "not_a_lever_here": 1}, ("gpu_count", "tensor_parallel", "request_rate",
                          "prefill_gpus", "decode_gpus"))  # fmt: skip
    assert fields == {"gpus": 8, "tp": 2, "rate": 3.0} and isinstance(fields["gpus"], int)
    # The three builders agree on what a lever means.
    levers = DEFAULTS | {"max_num_seqs": 12, "max_batched_tokens": 512, "prompt_tokens": 300, "request_rate": 2.0}
    lab, live = sim_spec(levers), live_spec(levers | {"gpu_count": 1, "max_replicas": 1})
    ab = parse_experiment({"a": {"max_num_seqs": 12, "max_batched_tokens": 512}, "traffic": {"prompt_tokens": 300}})
    for spec in (lab, live, ab.spec("a")):
        assert (spec.max_num_seqs, spec.max_batched_tokens, spec.input_tokens) == (12, 512, 300)
