"""Host work per step by engine generation (engine/sim/host_profiles.py, issue 42): Vidur's
measured stages, paid in series, once per multi-step run, or hidden behind the GPU's step; the
default profile leaves every step's cost as it was."""

from __future__ import annotations

import dataclasses

import pytest

from engine.clock import VirtualClock
from engine.core.llm_engine import LLMEngine
from engine.core.step_record import StepRecord
from engine.sampling_params import SamplingParams
from engine.sim import constants as C
from engine.sim.compare import command_for, parse_experiment, spec_from_command
from engine.sim.cost_model import CostModel, StepShape
from engine.sim.deployment import Deployment, SimConfigError
from engine.sim.devices import get_device
from engine.sim.host_profiles import PROFILES, VIDUR_A100, HostMode
from engine.sim.models import get_model
from engine.sim.run import SimSpec
from engine.sim.runner import sim_executor, step_shape

pytestmark = pytest.mark.unit

DECODE_32 = StepShape(32, 32, 32, 32 * 500, 0.0, 0, 32)
DECODE_8 = StepShape(8, 8, 8, 8 * 500, 0.0, 0, 8)


def cost(host: str, shape: StepShape, tp: int = 1, model: str = "llama-3.1-8b") -> float:
    return CostModel(Deployment(get_model(model), get_device("h100"), tp, host=host)).step(shape).total_s


def test_the_vidur_table_sums_to_its_published_step_costs() -> None:
    """Llama-2-7B TP1: 1.97 ms a step at batch 8 and 7.59 ms at 64, about 0.10 ms a sequence;
    Llama-2-70B TP4: 0.12 ms a sequence (the issue's reading of cpu_overheads.csv)."""
    def total(tp: int, batch: int) -> float:
        row = VIDUR_A100[tp]
        return sum(stage.at(batch) for stage in (row.schedule, row.sampler, row.prepare, row.process))

    assert total(1, 8) == pytest.approx(1.970e-3, abs=2e-6) and total(1, 64) == pytest.approx(7.593e-3, abs=2e-6)
    assert (total(1, 64) - total(1, 8)) / 56 == pytest.approx(0.100e-3, abs=1e-6)
    assert (total(4, 64) - total(4, 8)) / 56 == pytest.approx(0.119e-3, abs=1e-6)


def test_serial_adds_every_stage_in_place_of_the_fixed_overhead() -> None:
    base, serial = cost("default", DECODE_8), cost("python-2024", DECODE_8)
    assert serial - base == pytest.approx(1.970e-3 - C.STEP_OVERHEAD_S, abs=2e-6)
    # The default profile is the cost model as it was: a shape without the new fields costs the same.
    assert cost("default", dataclasses.replace(DECODE_8, num_seqs=0)) == base


def test_multi_step_pays_the_schedule_once_a_run_and_hides_output_processing() -> None:
    first = cost("vllm-0.6-multistep", DECODE_32)
    later = cost("vllm-0.6-multistep", dataclasses.replace(DECODE_32, scheduled=False))
    row = VIDUR_A100[1]
    assert first - later == pytest.approx(row.schedule.at(32) + row.prepare.at(32), rel=1e-9)
    serial = cost("python-2024", DECODE_32)
    assert serial - first == pytest.approx(row.process.at(32), rel=1e-9)  # hidden: the GPU step is longer


def test_overlapped_is_the_longer_of_host_and_gpu() -> None:
    gpu = cost("default", DECODE_32) - C.STEP_OVERHEAD_S
    host = PROFILES["overlapped"].cost(32, 1, True).hidden_s
    assert cost("overlapped", DECODE_32) == pytest.approx(max(gpu, host), rel=1e-9)
    assert PROFILES["overlapped"].mode is HostMode.OVERLAPPED


def test_a_profile_is_a_side_key_and_round_trips_through_its_command() -> None:
    experiment = parse_experiment({
        "traffic": {"request_rate": 4.0, "num_requests": 50},
        "a": {"host_profile": "python-2024"}, "b": {"host_profile": "overlapped"},
    })  # fmt: skip
    spec = experiment.spec("a")
    assert "--host-profile python-2024" in command_for(spec)
    assert spec_from_command(command_for(spec)).host_profile == "python-2024"
    with pytest.raises(SimConfigError, match="host profile"):
        Deployment(get_model("llama-3.1-8b"), get_device("h100"), host="vllm-2030")


def test_async_output_reaches_the_client_one_step_later() -> None:
    """An engine that processes a step's outputs while the next step runs (vLLM 0.6, SGLang 0.4,
    vLLM v1) delivers each token when that next step ends: a lone request's first token waits one
    decode step if it has more to generate, none if the prompt's step was its last (nothing follows
    to wait for). A serial engine delivers it at its own step's end either way."""
    from engine.sim.run import simulate

    def ttft(profile: str, output_tokens: int) -> float:
        spec = SimSpec("llama-3.1-8b", "h100", 1, input_tokens=1000, output_tokens=output_tokens, num_requests=1,
                       host_profile=profile)  # fmt: skip
        return simulate(spec)["ttft_p50_s"]

    assert ttft("python-2024", 5) == pytest.approx(ttft("python-2024", 1), rel=1e-9)
    one_step = ttft("overlapped", 5) - ttft("overlapped", 1)
    decode = cost("overlapped", StepShape(1, 1, 1, 1001, 0.0, 0, 1))
    assert one_step == pytest.approx(decode, rel=1e-6)


def recorded_steps(profile: str, model: str) -> list[tuple[StepRecord, StepShape]]:
    """Four requests through a simulated engine, stepped as SimReplica steps it (begin, price,
    the clock on by the step's time, end): each step's record beside the shape it priced."""
    spec = SimSpec(model, "h100", 1, host_profile=profile)
    dep, config, clock = spec.deployment(), spec.engine_config(), VirtualClock()
    engine = LLMEngine(config, clock, sim_executor(dep, config))
    for i in range(4):
        params = SamplingParams(max_tokens=6, ignore_eos=True)
        engine.add_request(f"r{i}", None, params, prompt_token_ids=list(range(1, 300 + 40 * i)))
    steps = []
    while engine.has_work():
        _, batch = engine.begin_step()
        shape = step_shape(batch)[0]
        tokens = engine.runner.execute(batch)
        clock.advance(engine.runner.last_cost.total_s)
        engine.end_step(batch, tokens)
        assert engine.step_records is not None
        steps += [(record, shape) for record in engine.step_records.take()]
    return steps


@pytest.mark.parametrize("model", ["llama-3.1-8b", "smollm2-135m"])
def test_a_step_record_splits_the_model_from_the_host_as_the_profile_pays_it(model: str) -> None:
    """The model's part of a step is the same under every profile (the GPU's work); the host's is
    the fixed overhead by default, every stage where serial, and only what outlasts the GPU's step
    where overlapped: what the step's span holds, not what ran beside it."""
    device = get_device("h100")
    model_time = CostModel(Deployment(get_model(model), device, 1))  # the default profile, its overhead taken out
    seen_excess = False
    for profile in ("default", "python-2024", "overlapped"):
        steps = recorded_steps(profile, model)
        assert len(steps) >= 6
        for record, shape in steps:
            gpu = model_time.step(shape).total_s - device.step_overhead_s
            host = PROFILES[profile].cost(shape.num_seqs, 1, True)
            if profile == "default":
                expected = device.step_overhead_s
            elif profile == "python-2024":
                expected = host.serial_s
            else:  # overlapped: the host's stages ran beside the GPU; only their excess is in the span
                expected = max(0.0, host.hidden_s - gpu)
            assert record.model_s == pytest.approx(gpu, rel=1e-9)
            assert record.end - record.start - record.model_s == pytest.approx(expected, rel=1e-6, abs=1e-12)
            seen_excess |= profile == "overlapped" and expected > 0
    assert seen_excess or model != "smollm2-135m", "a small model's GPU step should be shorter than the host's"
