"""The simulator's closed loop (`--concurrency N`, as `vllm bench serve --max-concurrency N`): never
more than N requests in flight, the next sent when one ends (finished, refused, failed), the same
run for a seed, the achieved request rate reported; with a rate too, the rate's arrivals wait for a
free client (vLLM's semantics), and a concurrency that never binds is the open-loop run itself."""

from __future__ import annotations

import json

import pytest

from engine.sim.__main__ import main
from engine.sim.run import SimSpec, simulate

pytestmark = pytest.mark.unit

SMALL = {"model": "llama-3.1-8b", "device": "h100", "gpus": 1, "dtype": "fp8", "input_tokens": 300, "output_tokens": 40,
         "num_requests": 120, "seed": 3}  # fmt: skip
TIMING = {"wall_s", "sim_s_per_wall_s"}


def test_never_more_than_n_in_flight_and_littles_law_holds() -> None:
    r = simulate(SimSpec(**SMALL, concurrency=4))
    assert r["completed"] == 120 and r["refused"] == {}
    assert r["concurrency"] == 4 and r["in_flight_max"] == 4
    # The replica's own count (max_num_seqs 1024 leaves it free to run all it is given) agrees.
    assert r["running_max"] <= 4
    # The achieved rate is what the run finished per simulated second ...
    assert r["request_s"] == pytest.approx(r["completed"] / r["simulated_s"])
    # ... and with fixed lengths every request takes about the same: N = rate x latency.
    assert r["request_s"] * r["e2el_p50_s"] == pytest.approx(4, rel=0.1)
    one = simulate(SimSpec(**SMALL, concurrency=1))
    assert one["in_flight_max"] == 1 and one["running_max"] == 1
    assert one["request_s"] < r["request_s"] and one["ttft_p99_s"] <= r["ttft_p99_s"]


def test_the_same_seed_gives_the_same_run() -> None:
    spec = {**SMALL, "input_range_ratio": 0.5, "concurrency": 6}
    first, second = simulate(SimSpec(**spec)), simulate(SimSpec(**spec))
    assert {k: v for k, v in first.items() if k not in TIMING} == {k: v for k, v in second.items() if k not in TIMING}
    other = simulate(SimSpec(**{**spec, "seed": 4}))
    assert other["simulated_s"] != first["simulated_s"]


def test_a_refused_or_failed_request_frees_its_client_at_once() -> None:
    # One slot, a queue of two: most of the clients' requests are refused, each client sending the next.
    spec = SimSpec(**SMALL, concurrency=8, max_num_seqs=1, queue_cap=2)
    r = simulate(spec)
    assert r["refused"].get("queue_full", 0) > 0
    assert r["completed"] + sum(r["refused"].values()) == 120 and r["in_flight_max"] <= 8
    killed = simulate(SimSpec(**{**SMALL, "gpus": 2}, concurrency=6, kill_replica_at_s=0.3))
    assert killed["refused"].get("replica 0 killed", 0) > 0
    assert killed["completed"] + sum(killed["refused"].values()) == 120 and killed["kv_blocks_free_at_end"]


def test_with_a_rate_the_arrivals_wait_for_a_free_client() -> None:
    spec = {**SMALL, "gpus": 2, "input_range_ratio": 0.5, "rate": 30.0}
    open_loop = simulate(SimSpec(**spec))
    # A concurrency that never binds leaves the open-loop run as it was, figure for figure (the
    # loop's event count aside: a closed loop's request is due, then sent).
    loose = simulate(SimSpec(**spec, concurrency=120))
    assert loose["in_flight_max"] < 120
    same = lambda r: {k: v for k, v in r.items() if k in open_loop and k not in TIMING | {"events"}}
    assert same(loose) == same(open_loop)
    # A binding one holds the arrivals back: fewer in flight, a longer run.
    tight = simulate(SimSpec(**spec, concurrency=2))
    assert tight["in_flight_max"] == 2 and tight["running_max"] <= 2 and tight["completed"] == 120
    assert tight["simulated_s"] > open_loop["simulated_s"] and tight["request_s"] < open_loop["request_s"]


def test_disaggregated_pools_end_a_request_when_its_decode_ends() -> None:
    r = simulate(SimSpec(**{**SMALL, "gpus": 2}, concurrency=5, prefill_gpus=1, decode_gpus=1))
    assert r["completed"] == 120 and r["in_flight_max"] == 5 and r["kv_blocks_free_at_end"]
    # Five in flight across both pools: never more than five on one of them.
    assert r["running_max"] <= 5
    assert r["request_s"] * r["e2el_p50_s"] == pytest.approx(5, rel=0.15)


def test_an_autoscaled_fleet_takes_the_same_clients() -> None:
    r = simulate(SimSpec(**{**SMALL, "gpus": 2}, concurrency=3, autoscale=True, min_replicas=1))
    assert r["completed"] == 120 and r["in_flight_max"] == 3 and r["running_max"] <= 3


def test_the_cli_takes_concurrency_and_refuses_less_than_one(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--model", "llama-3.1-8b", "--device", "h100", "--dtype", "fp8", "--input-tokens", "300",
            "--output-tokens", "40", "--num-requests", "60", "--rate", "20", "--concurrency", "3"]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["concurrency"] == 3 and r["in_flight_max"] <= 3 and r["completed"] == 60
    assert main([*argv[:-1], "0"]) == 2
    captured = capsys.readouterr()
    assert "--concurrency 0 must be at least 1" in captured.err and captured.out == ""
