"""The what-if CLI's contract: its JSON keys, determinism, a clean end state, and exit code 2
with a clear reason for each configuration that cannot run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.sim.__main__ import CONTRACT_KEYS, main
from engine.sim.cost_model import CostModel, StepShape
from engine.sim.run import SimSpec, simulate

pytestmark = pytest.mark.integration

SMALL = ["run", "--model", "llama-3.1-8b", "--device", "h100", "--gpus", "2", "--tp", "1", "--pp", "1", "--dtype", "fp8",
         "--input-tokens", "300", "--output-tokens", "40", "--input-range-ratio", "0.5", "--num-requests", "120",
         "--rate", "30", "--burstiness", "0.5", "--seed", "3"]


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_every_contract_key_and_same_seed_gives_same_json(capsys):
    first = run_json(SMALL, capsys)
    assert set(CONTRACT_KEYS) <= set(first)
    assert first["replicas"] == 2 and first["completed"] == 120 and first["refused"] == {}
    assert 0 < first["ttft_p50_s"] <= first["ttft_p99_s"] and 0 < first["tpot_p50_s"] <= first["tpot_p99_s"]
    assert first["output_tok_s_per_gpu"] == pytest.approx(first["output_tok_s"] / 2)
    second = run_json(SMALL, capsys)
    timing = {"wall_s", "sim_s_per_wall_s"}
    assert {k: v for k, v in first.items() if k not in timing} == {k: v for k, v in second.items() if k not in timing}
    other = run_json(SMALL[:-1] + ["4"], capsys)
    assert other["simulated_s"] != first["simulated_s"]


def test_a_run_ends_with_every_block_free_and_every_request_finished_or_refused():
    # A tight queue refuses some at admission; a replica killed mid-run fails its residents.
    spec = SimSpec("llama-3.1-8b", "h100", gpus=2, dtype="fp8", input_tokens=500, output_tokens=100,
                   num_requests=200, rate=400, queue_cap=40, max_num_seqs=8, kill_replica_at_s=0.5, seed=1)
    result = simulate(spec)
    refused = sum(result["refused"].values())
    assert result["completed"] + refused == 200
    assert result["refused"].get("queue_full", 0) > 0
    assert result["refused"].get("replica 0 killed", 0) > 0
    assert result["kv_blocks_free_at_end"]


def test_table_without_json(capsys):
    assert main(SMALL) == 0
    out = capsys.readouterr().out
    assert "Simulated serving run" in out and "output_tok_s" in out and "ttft_p99_s" in out


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (["--model", "gpt-5"], "known models: smollm2-135m, llama-3.1-8b"),
        (["--device", "tpu-v5"], "known devices: h100, h200, a100, b200, l4, mi300x, cpu"),
        (["--gpus", "8", "--tp", "3"], "must divide llama-3.1-8b's 32 query heads"),
        (["--gpus", "2", "--tp", "4"], "tensor parallel 4 needs 4 GPUs; --gpus is 2"),
        (["--gpus", "6", "--tp", "2", "--pp", "2"], "--gpus 6 is not a whole number of TP2 x PP2 replicas"),
        (["--gpus", "33", "--pp", "33"], "pipeline parallel 33 must be from 1 to llama-3.1-8b's 32 layers"),
        (["--model", "llama-3.1-405b", "--gpus", "8", "--tp", "8", "--dtype", "bf16"],
         "needs 812 GB of weights; 8 x h100 hold 640 GB: use fp8, or more GPUs a replica"),
        (["--model", "llama-2-70b", "--gpus", "8", "--tp", "8", "--input-tokens", "4000", "--output-tokens", "500"],
         "longer than llama-2-70b's context of 4096"),
        (["--dtype", "fp4"], "only b200"),
    ],
)
def test_bad_input_exits_2_with_the_reason(changes, reason, capsys):
    argv = list(SMALL)
    for flag, value in zip(changes[::2], changes[1::2]):
        argv[argv.index(flag) + 1] = value
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert reason in captured.err and captured.out == ""


def test_the_module_entry_point_prints_one_json_object():
    out = subprocess.run(
        [sys.executable, "-m", "engine.sim", *SMALL[:-2], "--num-requests", "20", "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert set(CONTRACT_KEYS) <= set(json.loads(out))
    bad = subprocess.run([sys.executable, "-m", "engine.sim", "run", "--model", "x", "--device", "h100"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown model" in bad.stderr


def test_disaggregated_pools_hand_the_kv_over_and_finish_everything():
    common = {"model": "llama-3.1-8b", "device": "h200", "gpus": 4, "tp": 1, "dtype": "fp8", "input_tokens": 2000,
              "output_tokens": 50, "num_requests": 60, "rate": 20.0, "seed": 2}
    colocated = simulate(SimSpec(**common))
    split = simulate(SimSpec(**common, prefill_gpus=1, decode_gpus=3))
    assert split["completed"] == colocated["completed"] == 60
    assert split["prefill_replicas"] == 1 and split["replicas"] == 4
    assert split["kv_blocks_free_at_end"]
    # Decode replicas never recompute the prompt (they find its KV through their prefix cache):
    # no gap between tokens is as long as one 2000-token prefill step.
    dep = SimSpec(**common).deployment()
    prefill_s = CostModel(dep).step(StepShape(2000, 1, 0, 0, 2000 * 2001 / 2, 0)).total_s
    assert split["itl_p99_s"] < prefill_s / 2


def test_a_split_that_is_not_whole_replicas_exits_2(capsys):
    argv = SMALL + ["--prefill-gpus", "1", "--decode-gpus", "2"]
    assert main(argv) == 2
    assert "add up to --gpus 2" in capsys.readouterr().err
