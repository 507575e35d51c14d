"""The simulated lab: the real Fleet, Router and Autoscaler over SimReplicas, fed by open-ended
arrivals from the levers, checked by the simulator before it starts. Most tests run its loop
directly (simulated time, no wall clock); the pacer's ticks run on a virtual wall clock, and one
test runs its real thread, asserting no pace (a busy machine ticks slower)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from engine.clock import VirtualClock
from engine.errors import InvalidParamError
from engine.lab.envelope import bottlenecks
from engine.lab.simulated.lab_check import badge, check_sim, model_label
from engine.lab.simulated.lab_sim import MAX_LAG_S, SimLab
from engine.levers import LEVERS, validate_levers
from engine.serving.telemetry.snapshot import SNAPSHOT_HZ, FleetSnapshot
from engine.sim.devices import DEVICE_NAMES
from engine.sim.models import MODEL_NAMES
from tests.support.waiting import wait_for

pytestmark = pytest.mark.unit

DEFAULTS = {key: lever.default for key, lever in LEVERS.items()}
SEVENTY_B = DEFAULTS | {
    "executor": "sim", "model": "llama-3.1-70b", "device": "h100", "gpu_count": 8, "tensor_parallel": 8,
    "request_rate": 50.0, "max_num_seqs": 256, "prompt_tokens": 200, "output_tokens": 100,
    "max_batched_tokens": 8192, "queue_cap": 1000,
}


def run_for(lab: SimLab, seconds: float) -> FleetSnapshot:
    """Run the simulated fleet `seconds` of simulated time; its newest snapshot."""
    lab.loop.run(until=lab.clock.now() + seconds)
    assert lab._latest is not None
    return lab._latest


def test_the_levers_name_the_simulators_models_and_devices() -> None:
    assert LEVERS["model"].choices == MODEL_NAMES and LEVERS["device"].choices == DEVICE_NAMES
    assert validate_levers({"executor": "sim", "sim_speed": 60, "gpu_count": 512, "prompt_tokens": 32768})
    with pytest.raises(InvalidParamError) as err:
        validate_levers({"executor": "remote"})
    assert err.value.param == "executor"
    with pytest.raises(InvalidParamError):
        validate_levers({"sim_speed": 5})


def test_a_config_that_cannot_run_is_refused_with_the_simulators_reason_next_to_its_lever() -> None:
    one = SEVENTY_B | {"gpu_count": 1, "tensor_parallel": 1}
    with pytest.raises(InvalidParamError) as err:
        check_sim(one, {"model": "llama-3.1-70b"})
    assert err.value.param == "model" and "needs 141 GB of weights; 1 x h100 hold 80 GB" in err.value.message
    check_sim(one | {"gpu_count": 2, "tensor_parallel": 2}, {"tensor_parallel": 2})  # TP2 fits
    with pytest.raises(InvalidParamError) as err:  # SmolLM2's 3 KV heads do not split 2 ways
        check_sim(DEFAULTS | {"gpu_count": 2, "tensor_parallel": 2}, {"tensor_parallel": 2})
    assert err.value.param == "tensor_parallel" and "must divide" in err.value.message
    with pytest.raises(InvalidParamError) as err:
        check_sim(SEVENTY_B | {"gpu_count": 12}, {"gpu_count": 12})
    assert err.value.param == "gpu_count" and "whole number of TP8" in err.value.message
    with pytest.raises(InvalidParamError) as err:
        check_sim(SEVENTY_B | {"gpu_count": 16, "prefill_gpus": 8, "decode_gpus": 16}, {"decode_gpus": 16})
    assert err.value.param == "decode_gpus" and "add up to --gpus 16" in err.value.message
    with pytest.raises(InvalidParamError) as err:
        check_sim(SEVENTY_B | {"weight_dtype": "fp4"}, {"weight_dtype": "fp4"})
    assert err.value.param == "weight_dtype" and "FP4" in err.value.message


def test_badge_names_the_configuration() -> None:
    assert badge(SEVENTY_B | {"gpu_count": 64}) == "simulated: H100 x 64, Llama-3.1-70B, TP8"
    assert model_label("smollm2-135m") == "SmolLM2-135M"


def test_the_simulated_fleet_serves_open_ended_traffic_through_the_live_snapshot_contract() -> None:
    lab = SimLab(SEVENTY_B, lambda snap: None)
    lab.start_traffic()
    snap = run_for(lab, 8.0)
    assert snap.time == pytest.approx(8.0, abs=0.2)  # simulated seconds
    for key in ("queue_depth", "running", "kv_used_blocks", "kv_total_blocks", "ttft_p99", "itl_p50",
                "tokens_per_s", "replicas", "batch_size", "max_num_seqs", "rejected", "preempted"):
        assert key in snap.to_json()
    assert snap.running > 0 and snap.tokens_per_s > 0 and snap.ttft_p99 is not None
    assert lab.finished > 100 and lab.sent >= 300  # about 50 req/s for 8 s
    assert snap.allreduce_ms > 0  # TP8: the cost model's all-reduces
    facts = lab.facts()
    weights = next(r for r in bottlenecks(lab.levers, facts, snap) if r.key == "weights")
    assert weights.text.startswith("17.6 GB of weights per device, on each of 8")
    kinds = {e["kind"] for e in lab.events.recent(limit=2000)}
    assert {"admitted", "finished"} <= kinds
    lab.stop_traffic()
    sent = lab.sent
    run_for(lab, 2.0)
    assert lab.sent == sent  # stopped: no arrival after


def test_levers_apply_in_place_or_call_for_a_new_fleet() -> None:
    lab = SimLab(SEVENTY_B, lambda snap: None)
    assert lab.needs_rebuild({"model": "llama-3.1-405b"}) and lab.needs_rebuild({"device": "h200"})
    assert not lab.needs_rebuild({"request_rate": 5.0, "max_num_seqs": 32, "queue_cap": 8})
    lab.apply({"max_num_seqs": 32, "queue_cap": 8, "request_rate": 500.0})
    lab.start_traffic()
    snap = run_for(lab, 3.0)
    assert all(r.config.max_num_seqs == 32 for r in lab.fleet.replicas)
    assert snap.max_num_seqs == 32 and snap.running <= 32
    assert lab.fleet.router.config.queue_cap == 8 and snap.rejected.get("queue_full", 0) > 0


def test_a_prefill_decode_split_runs_two_pools_with_one_event_log() -> None:
    levers = SEVENTY_B | {"gpu_count": 16, "tensor_parallel": 4, "prefill_gpus": 8, "decode_gpus": 8,
                          "prompt_tokens": 4000, "request_rate": 4.0}
    lab = SimLab(levers, lambda snap: None)
    assert lab.autoscaler is None and lab.decode_fleet is not None
    lab.start_traffic()
    snap = run_for(lab, 10.0)
    assert snap.replicas.get("ready") == 4  # two prefill and two decode replicas of TP4
    assert snap.ttft_p99 is not None and snap.itl_p50 is not None and lab.finished > 10
    assert lab.decode_fleet.events is lab.fleet.events


class ManualPacer:
    """Stands in for SimLab's WallClockDriver: the test runs each tick itself while it moves a
    virtual wall clock, so what a tick does is checked, not how fast this machine is."""

    def __init__(self) -> None:
        self.period_s: float | None = None
        self.tick: Callable[[], bool] | None = None
        self.stopped = False

    def every(self, period_s: float, step: Callable[[], bool], wake: threading.Event | None = None) -> None:
        self.period_s, self.tick = period_s, step

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped = True

    @property
    def running(self) -> bool:
        return self.tick is not None and not self.stopped


def paced_lab(levers: dict[str, Any], got: list[FleetSnapshot]) -> tuple[SimLab, ManualPacer, VirtualClock]:
    """A SimLab on a virtual wall clock whose pacer the test ticks."""
    wall, pacer = VirtualClock(), ManualPacer()
    lab = SimLab(levers, got.append, wall=wall, pacer=pacer)
    lab.start_traffic()
    lab.start()
    assert pacer.tick is not None and pacer.period_s is not None
    assert pacer.tick()  # the first tick only starts the wall clock
    return lab, pacer, wall


def test_the_pacer_sends_a_snapshot_a_tick_at_least_five_a_wall_second_keeping_pace() -> None:
    got: list[FleetSnapshot] = []
    lab, pacer, wall = paced_lab(SEVENTY_B, got)
    assert pacer.period_s is not None and 1.0 / pacer.period_s >= 5  # the stream's promise, at any speed
    ticks = round(2.0 / pacer.period_s)  # two wall seconds
    for _ in range(ticks):
        wall.advance(pacer.period_s)
        assert pacer.tick()
    assert len(got) == ticks  # one snapshot a tick, none skipped, none doubled
    assert lab.clock.now() == pytest.approx(2.0)  # 1x: simulated time keeps pace with the wall
    assert 2.0 - 1.0 / SNAPSHOT_HZ <= got[-1].time <= 2.0  # the newest snapshot, not a stale one
    assert lab.achieved_speed == pytest.approx(1.0)
    wall.advance(3.0)  # a tick three wall seconds late (a stalled machine): the lag is dropped
    assert pacer.tick()
    assert lab.clock.now() == pytest.approx(2.0 + MAX_LAG_S) and len(got) == ticks + 1
    lab.stop()
    assert pacer.stopped and not lab.running


def test_at_10x_a_tick_runs_ten_simulated_seconds_a_wall_second() -> None:
    got: list[FleetSnapshot] = []
    lab, pacer, wall = paced_lab(SEVENTY_B | {"sim_speed": 10}, got)
    assert pacer.period_s is not None
    for _ in range(3):
        wall.advance(pacer.period_s)
        assert pacer.tick()
    assert len(got) == 3 and lab.clock.now() == pytest.approx(3 * pacer.period_s * 10)
    lab.stop()


def test_the_pacer_thread_streams_and_stops_for_good() -> None:
    """The real pacer thread: snapshots come, and none after stop(). Its pace is the virtual
    tests' above: here a busy machine may tick slower, so no count per second is asserted. The
    thread runs at nice 19, below the live engine's replicas."""
    got: list[FleetSnapshot] = []
    nice: set[int] = set()

    def receive(snap: FleetSnapshot) -> None:  # on the pacer's thread
        nice.add(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        got.append(snap)

    lab = SimLab(SEVENTY_B, receive)
    lab.start_traffic()
    lab.start()
    assert wait_for(lambda: len(got) >= 3, 30.0), len(got)
    assert sys.platform != "linux" or nice == {19}
    lab.stop()
    assert not lab.running and not any(t.name == "sim-pacer" for t in threading.enumerate())
    count = len(got)
    time.sleep(0.5)
    assert len(got) == count


def test_every_evolution_card_runs_at_scale_and_the_first_one_queues() -> None:
    from web.evolution import EVOLUTION

    base = DEFAULTS | {"executor": "sim"}
    for card in EVOLUTION:
        levers = validate_levers(card["sim_levers"])
        check_sim(base | levers, levers)
    # One H100 serving Llama-3.1-8B one request at a time: 2 req/s of 200-token answers queue up.
    lab = SimLab(base | EVOLUTION[0]["sim_levers"] | {"queue_cap": 1000}, lambda snap: None)
    lab.start_traffic()
    early = run_for(lab, 10.0).queue_depth
    late = run_for(lab, 20.0)
    assert late.running <= 1 and late.queue_depth > early > 0
