"""The deployment planner (`python -m engine.sim plan`): deterministic for a seed, a frontier no
point beats, a cheapest point that meets both SLOs when re-run from its own command, launch
commands in each server's real flags, and an impossible target answered with the closest point."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path

import pytest

from engine.errors import InvalidParamError
from engine.sim.__main__ import main as sim_main
from engine.sim.__main__ import parser as sim_parser
from engine.sim.deployment import SimConfigError
from engine.sim.launch_commands import launch_commands
from engine.sim.plan import run_plan
from engine.sim.plan_space import PlanQuery, Shape, search_space

pytestmark = pytest.mark.unit

GOLDEN = json.loads((Path(__file__).parent / "golden" / "launch_flags.json").read_text())

# Small enough for the unit tier: an 8B model, 200 requests a candidate, H100s in two dtypes.
QUERY = PlanQuery(
    model="llama-3.1-8b", rate=8.0, input_tokens=400, output_tokens=60, ttft_slo_ms=300, tpot_slo_ms=20,
    devices=("h100",), max_gpus=4, dtypes=("bf16", "fp8"), tp=(1, 2), pp=(1, 2), batch_slots=(16, 256),
    input_range_ratio=0.2, duration_s=10,
)  # fmt: skip


@pytest.fixture(scope="module")
def plan() -> dict:
    return run_plan(QUERY, workers=2).to_json()


def _dominates(a: dict, b: dict) -> bool:
    return (
        a["output_tok_s_per_gpu"] >= b["output_tok_s_per_gpu"]
        and a["tok_s_per_user"] >= b["tok_s_per_user"]
        and (a["output_tok_s_per_gpu"] > b["output_tok_s_per_gpu"] or a["tok_s_per_user"] > b["tok_s_per_user"])
    )


def test_the_same_query_gives_the_same_plan_on_any_number_of_workers(plan: dict) -> None:
    again = run_plan(QUERY, workers=1).to_json()
    for p in (plan, again):
        p["search"].pop("wall_s")
    assert again == plan
    assert plan["search"]["evaluated"] >= 10, plan["search"]


def test_the_frontier_is_what_no_other_point_beats(plan: dict) -> None:
    points = plan["points"]
    kept = [p for p in points if p["keeps_up"]]
    front = plan["frontier"]
    assert front and all(p["keeps_up"] and points[p["id"]] == p for p in front)
    for f in front:
        assert not any(_dominates(p, f) for p in kept), f
    on_front = {f["id"] for f in front}
    for p in kept:
        if p["id"] not in on_front:
            assert any(_dominates(f, p) or (f["output_tok_s_per_gpu"], f["tok_s_per_user"]) == (p["output_tok_s_per_gpu"], p["tok_s_per_user"])
                       for f in front), p  # fmt: skip
    # Ordered by throughput per GPU, falling, as speed per user rises.
    assert [f["output_tok_s_per_gpu"] for f in front] == sorted((f["output_tok_s_per_gpu"] for f in front), reverse=True)


def test_the_cheapest_feasible_point_meets_both_slos_in_its_own_rerun(plan: dict) -> None:
    assert plan["feasible"], plan["verdict"]
    confirmation = plan["cheapest"]
    best = plan["points"][confirmation["id"]]
    # The cheapest feasible shape of the search, unless a longer re-run of a cheaper one missed.
    feasible = [p for p in plan["points"] if p["meets_slo"]]
    cheaper = [p for p in feasible if p["usd_per_hour"] < best["usd_per_hour"]]
    assert len(cheaper) == len(plan["rejected_on_rerun"])
    assert {k: confirmation[k] for k in ("device", "tp", "pp", "replicas", "max_num_seqs")} == {
        k: best[k] for k in ("device", "tp", "pp", "replicas", "max_num_seqs")
    }
    assert confirmation["requests"] > QUERY.num_requests and confirmation["meets_slo"]
    assert confirmation["vllm_command"] == confirmation["launch"]["vllm"][0]["command"]
    argv = shlex.split(confirmation["command"])
    assert argv[:4] == ["python", "-m", "engine.sim", "run"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert sim_main([*argv[3:], "--json"]) == 0
    rerun = json.loads(out.getvalue())
    assert rerun["ttft_p99_s"] * 1000 <= QUERY.ttft_slo_ms and rerun["tpot_p99_s"] * 1000 <= QUERY.tpot_slo_ms
    assert rerun["ttft_p99_s"] == confirmation["ttft_p99_s"] and rerun["tpot_p99_s"] == confirmation["tpot_p99_s"]
    assert rerun["completed"] == confirmation["requests"]


def _check_flags(entry: dict) -> None:
    argv = entry["argv"]
    server = "vllm serve" if argv[:2] == ["vllm", "serve"] else " ".join(argv[:3])
    known = set(GOLDEN[server])
    flags = [a for a in argv if a.startswith("--")]
    assert flags and set(flags) <= known, (server, set(flags) - known)
    for i, arg in enumerate(argv):
        choices = GOLDEN["choices"].get(f"{server} {arg}")
        if choices is not None:
            assert argv[i + 1] in choices, (arg, argv[i + 1])


def test_launch_commands_use_each_servers_real_flags_and_the_shape() -> None:
    shapes = [
        Shape("h100", "fp8", 2, 1, 3, 256),  # three TP2 replicas: one node, data parallel 3
        Shape("h200", "bf16", 8, 2, 2, 1024),  # a replica across two nodes
        Shape("b200", "fp4", 4, 1, 6, 128, prefill_replicas=2),  # prefill/decode split
    ]
    q = PlanQuery(model="llama-3.1-70b", rate=10, input_tokens=1000, output_tokens=250, ttft_slo_ms=1000, tpot_slo_ms=50)
    for shape in shapes:
        launch = launch_commands(shape, q)
        entries = launch["vllm"] + launch["sglang"]
        for entry in entries:
            _check_flags(entry)
        vllm = launch["vllm"][0]["argv"]
        assert vllm[vllm.index("--tensor-parallel-size") + 1] == str(shape.tp)
        assert vllm[vllm.index("--pipeline-parallel-size") + 1] == str(shape.pp)
        sglang = launch["sglang"][0]["argv"]
        assert sglang[sglang.index("--tp-size") + 1] == str(shape.tp) and sglang[sglang.index("--pp-size") + 1] == str(shape.pp)
        # Every replica is served: data-parallel ranks a server times servers.
        served = sum(e["servers"] * int(e["argv"][e["argv"].index("--data-parallel-size") + 1]) for e in launch["vllm"])
        assert served == shape.replicas
    split = launch_commands(shapes[2], q)
    assert [e["role"] for e in split["sglang"]] == ["prefill", "decode", "router"]
    assert "--disaggregation-mode" in split["sglang"][0]["argv"] and "--kv-transfer-config" in split["vllm"][1]["argv"]
    assert "--distributed-executor-backend" in launch_commands(shapes[1], q)["vllm"][0]["argv"]


def test_an_impossible_target_is_said_with_the_closest_point() -> None:
    q = PlanQuery(**{**QUERY.__dict__, "tpot_slo_ms": 0.5, "tp": (1,), "pp": (1,), "dtypes": ("fp8",)})
    plan = run_plan(q, workers=1).to_json()
    assert not plan["feasible"] and plan["cheapest"] is None
    closest = plan["closest"]
    assert closest["reason"] == plan["verdict"] and plan["points"][closest["id"]]["command"] == closest["command"]
    assert "no shape searched meets" in plan["verdict"] and "closest" in plan["verdict"]
    ratio = lambda p: max(p["ttft_p99_s"] * 1000 / q.ttft_slo_ms, p["tpot_p99_s"] * 1000 / q.tpot_slo_ms)
    assert ratio(closest) == min(ratio(p) for p in plan["points"])
    assert closest["vllm_command"].startswith("vllm serve") and closest["launch"]["sglang"]  # where to start from


def test_the_bound_prunes_only_what_cannot_keep_up_and_sets_aside_what_does_not_fit() -> None:
    q = PlanQuery(**{**QUERY.__dict__, "model": "llama-3.1-70b", "rate": 100.0, "devices": ("h100", "l4"),
                     "gpu_hour_usd": (("l4", 0.8),)})  # fmt: skip
    space = search_space(q)
    # 70B does not fit one H100 in bf16, nor four L4s in any dtype; 100 req/s is too much for one or two H100s.
    assert space.too_slow > 0 and space.unfit > 0
    assert not any(s.device == "l4" for s in space.shapes)
    assert space.enumerated == len(space.shapes) + space.too_slow + space.unfit + space.idle


def test_a_query_that_cannot_run_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--model", "llama-3.1-8b", "--rate", "5", "--ttft-slo-ms", "500", "--tpot-slo-ms", "30"]
    assert sim_main([*base, "--devices", "mi300x"]) == 2
    assert "--gpu-hour-usd mi300x" in capsys.readouterr().err
    assert sim_main([*base[:4], "0", *base[5:]]) == 2
    assert "--rate" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sim_parser().parse_args([*base, "--tp", "0"])


# The same question asked of six users in a closed loop (vLLM's --max-concurrency): 20 s of them.
CLOSED = PlanQuery(**{**QUERY.__dict__, "rate": None, "concurrency": 6, "duration_s": 20, "tp": (1,), "pp": (1,)})


def test_a_closed_loop_query_plans_a_feasible_point_whose_rerun_carries_the_concurrency() -> None:
    plan = run_plan(CLOSED, workers=1).to_json()
    assert plan["query"]["concurrency"] == 6 and plan["query"]["rate"] is None
    assert plan["feasible"], plan["verdict"]
    # No shape has more replicas than requests could ever be in flight (Little's law, the clients).
    assert all(p["replicas"] <= 6 for p in plan["points"]) and "idle" in plan["search"]
    assert all(" --concurrency 6 " in p["command"] for p in plan["points"])
    confirmation = plan["cheapest"]
    argv = shlex.split(confirmation["command"])
    assert argv[argv.index("--concurrency") + 1] == "6" and argv[argv.index("--rate") + 1] == "inf"
    assert confirmation["requests"] == CLOSED.confirming().num_requests > CLOSED.num_requests
    assert not any("--concurrency" in e["command"] for e in confirmation["launch"]["vllm"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert sim_main([*argv[3:], "--json"]) == 0
    rerun = json.loads(out.getvalue())
    assert rerun["concurrency"] == 6 and rerun["in_flight_max"] <= 6 and rerun["completed"] == confirmation["requests"]
    assert (rerun["ttft_p99_s"], rerun["tpot_p99_s"]) == (confirmation["ttft_p99_s"], confirmation["tpot_p99_s"])
    # The achieved rate is what the plan prices, and what the lab link's clients send.
    assert rerun["request_s"] == confirmation["request_s"] > 0
    best = plan["points"][confirmation["id"]]
    assert f"request_rate={round(best['request_s'], 3)}" in best["lab"]


def test_the_concurrency_bounds_the_replicas_directly() -> None:
    q = PlanQuery(**{**CLOSED.__dict__, "concurrency": 2, "max_gpus": 8, "disaggregation": False})
    space = search_space(q)
    assert space.idle > 0 and max(s.replicas for s in space.shapes) == 2
    assert space.enumerated == len(space.shapes) + space.too_slow + space.unfit + space.idle


def test_the_traffic_is_a_rate_or_a_concurrency_not_both(capsys: pytest.CaptureFixture[str]) -> None:
    both = PlanQuery(**{**CLOSED.__dict__, "rate": 5.0})
    with pytest.raises(SimConfigError, match="--rate .* or --concurrency .*: not both"):
        both.check()
    with pytest.raises(SimConfigError, match="one is required"):
        PlanQuery(**{**CLOSED.__dict__, "concurrency": None}).check()
    body = {"model": "llama-3.1-8b", "input_tokens": 400, "output_tokens": 60, "ttft_slo_ms": 300, "tpot_slo_ms": 20}
    assert PlanQuery.from_body({**body, "concurrency": 8, "rate": None}).concurrency == 8
    with pytest.raises(InvalidParamError) as bad:
        PlanQuery.from_body({**body, "concurrency": 8, "rate": 5})
    assert bad.value.param == "rate"
    with pytest.raises(InvalidParamError) as bad:
        PlanQuery.from_body({**body, "concurrency": 0})
    assert bad.value.param == "concurrency"
    base = ["plan", "--model", "llama-3.1-8b", "--ttft-slo-ms", "500", "--tpot-slo-ms", "30"]
    with pytest.raises(SystemExit):
        sim_parser().parse_args([*base, "--rate", "5", "--concurrency", "4"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert sim_main([*base, "--concurrency", "0"]) == 2
    assert "--concurrency must be at least 1" in capsys.readouterr().err
