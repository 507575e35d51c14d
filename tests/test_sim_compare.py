"""A/B and predict-then-run (engine/sim/compare.py, engine/lab/simulated/predict.py): both sides replay
one request list, the table is the runs' own summaries, the cost is GPU-hours times the user's
price, a side's command reproduces it through the CLI, and bad sides are refused by name."""

from __future__ import annotations

import itertools
import math

import pytest

from engine.errors import InvalidParamError
from engine.lab.simulated.predict import live_spec, predict, windowed_tokens_per_s
from engine.levers import LEVERS
from engine.sim.compare import (
    RESULT_KEYS,
    as_cli_spec,
    command_for,
    gpu_seconds,
    parse_experiment,
    run_experiment,
    spec_from_command,
    workload_digest,
)
from engine.sim.presets import PRESETS
from engine.sim.run import SimSpec, simulate
from engine.sim.workload import Burst

pytestmark = pytest.mark.unit

SMALL = {"request_rate": 20.0, "prompt_tokens": 500, "output_tokens": 100, "num_requests": 120}


def small_tp(preset: str = "tp4_vs_tp8") -> dict:
    return {"preset": preset, "traffic": SMALL}


def test_both_sides_replay_one_request_list() -> None:
    experiment = parse_experiment(small_tp())
    a, b = experiment.spec("a"), experiment.spec("b")
    assert a.tp == 4 and b.tp == 8
    assert a.workload() == b.workload()  # the same arrivals and lengths, request by request
    result = run_experiment(experiment)
    digest = workload_digest(a.workload())
    assert (
        result["a"]["workload_digest"]
        == result["b"]["workload_digest"]
        == result["traffic"]["workload_digest"]
        == digest
    )
    assert result["a"]["summary"]["completed"] == result["b"]["summary"]["completed"] == SMALL["num_requests"]


def test_the_table_is_the_runs_summaries_and_the_command_reproduces_them() -> None:
    result = run_experiment(parse_experiment(small_tp()))
    for name in ("a", "b"):
        side = result[name]
        for key in ("output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "goodput_req_s"):
            assert side["row"][key] == side["summary"][key]
        # The command the page shows, run through the CLI's own parsing, gives the same figures.
        again = simulate(spec_from_command(side["command"]))
        for key in ("output_tok_s", "ttft_p99_s", "tpot_p50_s", "goodput_req_s", "simulated_s"):
            assert again[key] == pytest.approx(side["summary"][key], rel=1e-9), key
        assert side["timeline"] and side["timeline"][-1]["t"] == pytest.approx(side["summary"]["simulated_s"])


def test_every_quotable_key_is_a_number_of_a_run() -> None:
    """A lesson may quote RESULT_KEYS (web/lesson_checks.py refuses others): each is in a side's
    summary and row, a number."""
    body = small_tp() | {"a": {"num_speculative_tokens": 4, "spec_acceptance": 0.6}}  # speculation's figures too
    result = run_experiment(parse_experiment(body))
    figures = result["a"]["summary"] | result["a"]["row"]
    for key in RESULT_KEYS:
        assert isinstance(figures.get(key), (int, float)) and not isinstance(figures[key], bool), key
    plain = result["b"]["row"]
    assert plain["spec_acceptance"] is None and plain["spec_tokens_per_step"] is None  # it did not speculate


def test_commands_round_trip_for_every_preset() -> None:
    for preset in PRESETS:
        experiment = parse_experiment({"preset": preset})
        for name in ("a", "b"):
            spec = experiment.spec(name)
            assert spec_from_command(command_for(spec)) == as_cli_spec(spec), (preset, name)


def test_cost_is_gpu_hours_times_the_price_over_output_tokens() -> None:
    body = small_tp() | {"a": {"gpu_hour_usd": 2.0}, "b": {"gpu_hour_usd": 4.0}}
    result = run_experiment(parse_experiment(body))
    for name, price in (("a", 2.0), ("b", 4.0)):
        row, summary = result[name]["row"], result[name]["summary"]
        hours = 8 * summary["simulated_s"] / 3600  # 8 GPUs held for the whole run
        tokens = summary["output_tok_s"] * summary["simulated_s"]
        assert row["gpus_used"] == 8 and row["gpu_hours"] == pytest.approx(hours)
        assert row["cost_per_mtok_usd"] == pytest.approx(hours * price / tokens * 1e6)
    # The same fleet at twice the price costs twice as much per token (the runs differ only in TP).
    same = run_experiment(parse_experiment(small_tp() | {"b": {"tensor_parallel": 4, "gpu_hour_usd": 4.0}}))
    assert same["b"]["row"]["cost_per_mtok_usd"] == pytest.approx(2 * same["a"]["row"]["cost_per_mtok_usd"])


def test_an_autoscaled_side_pays_for_the_replicas_it_holds() -> None:
    spec = SimSpec(model="llama-3.1-8b", device="h100", gpus=8, tp=2, autoscale=True)
    timeline = [
        {"t": 0.0, "replicas": {"ready": 1}},
        {"t": 10.0, "replicas": {"ready": 1, "provisioning": 1}},
        {"t": 20.0, "replicas": {"ready": 2, "warm": 1, "stopped": 3}},
        {"t": 30.0, "replicas": {"ready": 2, "warm": 1}},
    ]
    seconds, most = gpu_seconds(spec, {"timeline": timeline, "simulated_s": 25.0})
    # Each row's fleet holds until the next row: 10 s x 1, 10 s x 2, then 5 s x 3 (to 25 s), 2 GPUs a replica.
    assert seconds == pytest.approx((10 * 1 + 10 * 2 + 5 * 3) * 2)
    assert most == 6


def test_bad_sides_are_refused_naming_the_side_and_the_lever() -> None:
    with pytest.raises(InvalidParamError) as err:
        parse_experiment(
            small_tp() | {"b": {"model": "llama-3.1-70b", "device": "h100", "gpu_count": 1, "tensor_parallel": 1}}
        )
    assert err.value.param == "b.model" and "141 GB" in err.value.message
    parse_experiment(
        small_tp() | {"b": {"model": "llama-3.1-70b", "device": "h100", "gpu_count": 2, "tensor_parallel": 2}}
    )
    with pytest.raises(InvalidParamError) as err:
        parse_experiment(small_tp() | {"a": {"gpu_count": 4, "tensor_parallel": 8}})
    assert err.value.param == "a.tensor_parallel"
    with pytest.raises(InvalidParamError) as err:
        parse_experiment(small_tp() | {"a": {"gpu_count": 12, "tensor_parallel": 8}})
    assert err.value.param == "a.gpu_count"
    with pytest.raises(InvalidParamError) as err:
        parse_experiment(small_tp() | {"b": {"prefill_gpus": 4, "decode_gpus": 0}})
    assert err.value.param.startswith("b.") and "decode" in err.value.message
    for body, param in (
        ({"a": {"warp_drive": 1}}, "a.warp_drive"),
        ({"traffic": {"request_rate": "fast"}}, "traffic.request_rate"),
        ({"b": {"device": "tpu"}}, "b.device"),
        ({"b": {"gpu_hour_usd": -1}}, "b.gpu_hour_usd"),
        ({"preset": "nope"}, "preset"),
        ({"traffic": {"num_requests": 4000, "output_tokens": 2000}}, "traffic.num_requests"),
    ):
        with pytest.raises(InvalidParamError) as err:
            parse_experiment(small_tp() | body)
        assert err.value.param == param, body


def test_query_strings_coerce_like_json() -> None:
    from_text = parse_experiment({"traffic": {"request_rate": "20", "num_requests": "120"}, "b": {"paged": "false"}})
    from_json = parse_experiment({"traffic": {"request_rate": 20.0, "num_requests": 120}, "b": {"paged": False}})
    assert from_text.spec("b") == from_json.spec("b") and not from_text.spec("b").paged
    assert (
        parse_experiment({"a": {"model": "Llama-70B", "gpu_count": 2, "tensor_parallel": 2}}).spec("a").model
        == "llama-3.1-70b"
    )


def test_a_burst_compresses_the_arrivals_inside_its_window() -> None:
    spec = SimSpec(model="llama-3.1-8b", device="h100", gpus=1, num_requests=3000, rate=10.0,
                   burst_factor=3.0, burst_at_s=100.0, burst_s=20.0)  # fmt: skip
    arrivals = [r.arrival for r in spec.workload()]
    inside = sum(100 <= t < 120 for t in arrivals)
    before = sum(60 <= t < 80 for t in arrivals)
    assert 2.2 * before < inside < 3.8 * before  # about 3x the steady rate's count
    assert arrivals == sorted(arrivals)
    assert Burst(3.0, 100.0, 20.0).warp(160.0) == pytest.approx(120.0) and Burst(3.0, 100.0, 20.0).warp(200.0) == 160.0


def test_a_timeline_changes_nothing_the_run_measures() -> None:
    spec = SimSpec(model="llama-3.1-70b", device="h100", gpus=8, tp=8, input_tokens=500, output_tokens=100,
                   num_requests=100, rate=20)  # fmt: skip
    plain = simulate(spec)
    spec.timeline = True
    charted = simulate(spec)
    assert {k: v for k, v in charted.items() if k not in ("timeline", "wall_s", "sim_s_per_wall_s")} == {
        k: v for k, v in plain.items() if k not in ("wall_s", "sim_s_per_wall_s")
    }
    rows = charted["timeline"]
    assert max(row["running"] for row in rows) > 0 and rows[-1]["running"] == 0
    assert sum(row["output_tok_s"] * (row["t"] - prev["t"]) for prev, row in itertools.pairwise(rows)) == pytest.approx(
        plain["output_tok_s"] * plain["simulated_s"], rel=1e-6
    )


def live_levers(**changes: object) -> dict:
    return {key: lever.default for key, lever in LEVERS.items()} | changes


def test_prediction_matches_the_live_lab_and_refuses_what_it_cannot_model() -> None:
    spec = live_spec(live_levers(request_rate=2.0, max_num_seqs=16, kv_budget_mb=64.0))
    assert (spec.device, spec.model, spec.gpus, spec.rate, spec.max_num_seqs) == ("cpu", "smollm2-135m", 1, 2.0, 16)
    assert spec.kv_budget_mb == 64.0 and spec.front_on_device and spec.input_range_ratio == 0.5
    assert spec.num_requests == 120  # 60 s of arrivals
    for levers, param in (
        (live_levers(request_rate=0.0), "request_rate"),
        (live_levers(tensor_parallel=2, gpu_count=2), "tensor_parallel"),
        (live_levers(gpu_count=2, max_replicas=2), "max_replicas"),
        (live_levers(executor="sim"), "executor"),
    ):
        with pytest.raises(InvalidParamError) as err:
            live_spec(levers)
        assert err.value.param == param


def test_prediction_series_cover_the_horizon() -> None:
    out = predict(live_levers(request_rate=1.0, max_num_seqs=16, kv_budget_mb=64.0))
    series = out["series"]
    assert out["horizon_s"] == 60.0 and series[0]["t"] == 0.0 and series[-1]["t"] <= 60.0
    assert max(row["tokens_per_s"] for row in series) > 0
    assert any(row["ttft_p50"] is not None for row in series)
    assert out["command"].startswith("python -m engine.sim run --model smollm2-135m --device cpu")


def test_windowed_tokens_per_s_counts_like_the_metrics_bus() -> None:
    rows = [{"t": float(t), "output_tok_s": 0.0 if t < 3 else 10.0} for t in range(41)]
    out = windowed_tokens_per_s(rows, window_s=30.0)
    assert out[2]["tokens_per_s"] == 0.0
    assert out[10]["tokens_per_s"] == pytest.approx(10.0)  # 70 tokens over the 7 s since the first
    assert out[40]["tokens_per_s"] == pytest.approx(10.0)  # the last 30 s only
    assert not any(math.isnan(row["tokens_per_s"]) for row in out)


def test_a_shared_link_is_the_experiment_it_names() -> None:
    from web.whatif import experiment_from_query

    query = {"ab": "tp4_vs_tp8", "t.num_requests": "120", "b.gpu_hour_usd": "2.5", "a.tensor_parallel": "4", "x": "1"}
    body = experiment_from_query(query)
    assert body == {"preset": "tp4_vs_tp8", "traffic": {"num_requests": "120"}, "b": {"gpu_hour_usd": "2.5"},
                    "a": {"tensor_parallel": "4"}}  # fmt: skip
    experiment = parse_experiment(body)
    assert (
        experiment.b.gpu_hour_usd == 2.5 and experiment.spec("b").tp == 8 and experiment.spec("a").num_requests == 120
    )
    assert experiment_from_query({"ab": "1", "a.model": "llama-3.1-70b"}) == {"a": {"model": "llama-3.1-70b"}}
