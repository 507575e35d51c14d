"""Autoscaling in simulation: the real Fleet and Autoscaler over simulated replicas on virtual
time. A burst scales the fleet up; a cold replica is READY only after its provisioning delay and
its weights' load (weight bytes per GPU / storage bandwidth); a warm pool replica serves at once;
and at the end every KV block is free and every request finished or was refused with a reason.
Every figure is simulated time, so nothing here depends on how fast this machine is."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from engine.sim import constants as C
from engine.sim.__main__ import main
from engine.sim.fleet_run import simulate_fleet
from engine.sim.models import get_model
from engine.sim.run import SimSpec

pytestmark = pytest.mark.unit

PROVISION_S = 20.0
WINDOWS = {"up_window_s": 5.0, "down_window_s": 30.0, "tick_s": 0.5}


def burst(**changes: Any) -> SimSpec:
    """1200 requests at 40 req/s (30 s) into one 8B replica with 16 batch slots: the queue builds at once."""
    spec = SimSpec(
        model="llama-3.1-8b", device="h100", gpus=3, input_tokens=500, output_tokens=100, num_requests=1200,
        rate=40.0, max_num_seqs=16, autoscale=True, min_replicas=1, max_replicas=2,
        provision_delay_s=PROVISION_S,
    )
    return replace(spec, **changes)


def every_request_answered(result: dict[str, Any], total: int) -> None:
    assert result["kv_blocks_free_at_end"]
    assert result["completed"] + sum(result["refused"].values()) == total
    assert all(reason for reason in result["refused"])


def first_time_ready(result: dict[str, Any], count: int) -> float:
    return next(row["t"] for row in result["timeline"] if row["replicas"].get("ready", 0) >= count)


@pytest.fixture(scope="module")
def cold() -> dict[str, Any]:
    return simulate_fleet(burst(), WINDOWS)


@pytest.fixture(scope="module")
def warm() -> dict[str, Any]:
    return simulate_fleet(burst(warm_pool=1), WINDOWS)


def test_a_burst_scales_up_and_the_cold_replica_waits_for_its_machine_and_its_weights(cold: dict[str, Any]) -> None:
    up = cold["scale_events"][0]
    assert up["delta"] == 1 and "cold start" in up["message"]
    assert up["t"] >= WINDOWS["up_window_s"]  # pressure for the whole short window first
    load_s = get_model("llama-3.1-8b").num_params * 2 / C.STORAGE_BW  # bf16 weights, one GPU
    assert cold["load_s"] == pytest.approx(load_s, rel=0.05)
    new = cold["replicas_started"][1]
    assert new["created_s"] == pytest.approx(up["t"] + PROVISION_S)
    assert new["ready_s"] == pytest.approx(up["t"] + PROVISION_S + cold["load_s"])
    assert cold["replicas"] == 2
    assert first_time_ready(cold, 2) >= new["ready_s"]
    before = [row for row in cold["timeline"] if up["t"] < row["t"] < new["created_s"]]
    assert before and all(row["replicas"].get("provisioning") == 1 for row in before)
    every_request_answered(cold, 1200)


def test_a_warm_pool_replica_serves_at_once(cold: dict[str, Any], warm: dict[str, Any]) -> None:
    up = warm["scale_events"][0]
    assert "from the warm pool" in up["message"]
    promoted = warm["replicas_started"][1]
    assert promoted["ready_s"] == 0.0  # loaded before the run, beside the first replica
    assert first_time_ready(warm, 2) <= up["t"] + 1.0  # one timeline row later at most
    assert first_time_ready(warm, 2) + PROVISION_S < first_time_ready(cold, 2)
    assert warm["ttft_p99_s"] < cold["ttft_p99_s"]
    every_request_answered(warm, 1200)


def test_settling_drains_back_to_min_replicas_after_the_long_window() -> None:
    result = simulate_fleet(burst(settle=True, provision_delay_s=1.0), WINDOWS)
    deltas = [e["delta"] for e in result["scale_events"]]
    assert deltas == [1, -1], result["scale_events"]
    down = result["scale_events"][-1]
    assert "draining replica" in down["message"]
    assert down["t"] >= result["scale_events"][0]["t"] + WINDOWS["down_window_s"]  # a capacity change restarts it
    assert result["simulated_s"] < result["settled_s"]  # the figures span the work, not the idle tail
    every_request_answered(result, 1200)


def test_a_killed_replica_is_replaced_and_no_request_is_lost() -> None:
    result = simulate_fleet(burst(kill_replica_at_s=3.0, provision_delay_s=1.0), WINDOWS)
    assert "replica 0 killed" in result["refused"]  # what was on it failed, saying why
    assert result["scale_events"][0]["message"].startswith("0 ready + 0 starting < min_replicas 1")
    every_request_answered(result, 1200)


def test_the_cli_runs_an_autoscaled_fleet_and_keeps_its_contract(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    argv = [
        "run", "--model", "llama-3.1-8b", "--device", "h100", "--gpus", "2", "--input-tokens", "500",
        "--output-tokens", "50", "--num-requests", "600", "--rate", "40", "--max-num-seqs", "16",
        "--autoscale", "true", "--max-replicas", "2", "--provision-delay-s", "5", "--storage-gbs", "4", "--json",
    ]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    from engine.sim.__main__ import CONTRACT_KEYS

    assert set(CONTRACT_KEYS) <= set(result) and result["timeline"] and result["scale_events"][0]["delta"] == 1
    assert result["load_s"] == pytest.approx(get_model("llama-3.1-8b").num_params * 2 / 4e9, rel=0.05)
