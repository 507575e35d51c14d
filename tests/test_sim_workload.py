"""simulate() on an explicit workload (bench/sim_vs_live.py replays a live run's arrivals and
lengths), and the cost model's per-sampled-row host term that the `cpu` calibration fits."""

from __future__ import annotations

import dataclasses

import pytest

from engine.core.prompt_ids import checked_prompt_ids
from engine.errors import InvalidParamError
from engine.sim.cost_model import CostModel, StepShape
from engine.sim.deployment import Deployment
from engine.sim.devices import get_device
from engine.sim.models import get_model
from engine.sim.run import SimSpec, simulate
from engine.sim.workload import SimRequest

pytestmark = pytest.mark.unit


def test_an_explicit_workload_runs_exactly_its_requests():
    requests = [SimRequest("0", 0.0, 300, 20), SimRequest("1", 0.5, 40, 7), SimRequest("2", 2.0, 1000, 1)]
    spec = SimSpec(model="llama-3.1-8b", device="h100", gpus=1, input_tokens=1000, output_tokens=20,
                   num_requests=len(requests), max_num_seqs=8, max_batched_tokens=512)  # fmt: skip
    result = simulate(spec, requests)
    assert result["completed"] == 3 and result["kv_blocks_free_at_end"]
    assert result["output_tok_s"] * result["simulated_s"] == pytest.approx(28)
    assert result["simulated_s"] > 2.0  # the last request arrived at 2 s and still had to run
    # The spec's own workload (its lengths, its arrivals) is a different run.
    assert simulate(spec)["simulated_s"] != result["simulated_s"]


def test_the_per_row_host_term_adds_per_sampled_row_only():
    h100 = get_device("h100")
    assert h100.token_overhead_s == 0.0  # GPUs: the per-step constants cover the host
    slow = dataclasses.replace(h100, token_overhead_s=1e-4)
    base, extra = (CostModel(Deployment(get_model("llama-3.1-8b"), d)) for d in (h100, slow))
    decode = StepShape(num_tokens=32, num_sampled=32, num_decodes=32, decode_context=32 * 500)
    assert extra.step(decode).total_s - base.step(decode).total_s == pytest.approx(32 * 1e-4)
    chunk = StepShape(num_tokens=512, num_sampled=0, prefill_attention=512 * 256.5)
    assert extra.step(chunk).total_s == base.step(chunk).total_s


def test_the_front_on_the_device_costs_its_cpu_per_token_and_its_hop_latency():
    """The live server on this machine: the HTTP front and the clients share the cores
    (SimSpec.front_on_device), at the costs `make calibrate` measured for the `cpu` device."""
    cpu = get_device("cpu")
    front = dataclasses.replace(cpu, front_token_s=0.002, front_latency_s=0.03).with_front()
    assert front.token_overhead_s == pytest.approx(cpu.token_overhead_s + 0.002)
    # One request alone: TTFT is its prefill step plus the hop, whatever the step costs.
    requests = [SimRequest("0", 0.0, 100, 4)]
    spec = SimSpec(model="smollm2-135m", device="cpu", gpus=1, input_tokens=100, output_tokens=4, num_requests=1)
    alone = simulate(spec, requests)
    served = simulate(dataclasses.replace(spec, front_on_device=True), requests)
    assert served["ttft_p50_s"] - alone["ttft_p50_s"] == pytest.approx(cpu.front_latency_s + cpu.front_token_s, rel=0.05, abs=1e-6)
    assert served["tpot_p50_s"] - alone["tpot_p50_s"] == pytest.approx(cpu.front_token_s, rel=0.05, abs=1e-6)


def test_a_range_prompt_is_checked_by_its_ends_as_a_list_is_by_every_id() -> None:
    assert list(checked_prompt_ids(range(5, 10), 100)) == checked_prompt_ids(list(range(5, 10)), 100) == [5, 6, 7, 8, 9]
    assert list(checked_prompt_ids(range(0), 100)) == []
    assert isinstance(checked_prompt_ids(range(5, 10), 100), range)  # kept compact: a big fleet runs thousands
    for bad in (range(95, 101), range(-1, 3), range(99, -2, -1)):
        with pytest.raises(InvalidParamError) as err:
            checked_prompt_ids(bad, 100)
        assert err.value.param == "prompt"
        with pytest.raises(InvalidParamError):
            checked_prompt_ids(list(bad), 100)
