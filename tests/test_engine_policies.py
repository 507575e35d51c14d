"""The engine under the 2024 engines' policies (EngineConfig.prefill_first, scheduler_steps), on
the what-if executor (no model): a multi-step run delivers its tokens together when it ends, and
the simulator takes both from its CLI."""

from __future__ import annotations

import pytest

from engine.clock import VirtualClock
from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.request_output import RequestOutput
from engine.sampling_params import SamplingParams
from engine.sim.__main__ import parser, spec_from
from engine.sim.deployment import SimConfigError
from engine.sim.run import simulate
from engine.sim.runner import sim_executor
from engine.sim.spec import SimSpec

pytestmark = pytest.mark.unit

STEP_S = 0.01


def engine_with(**levers: object) -> tuple[LLMEngine, VirtualClock]:
    dep = SimSpec("llama-3.1-8b", "h100", gpus=1).deployment()
    config = EngineConfig(**levers)  # type: ignore[arg-type]
    clock = VirtualClock()
    return LLMEngine(config, clock, sim_executor(dep, config)), clock


def step(engine: LLMEngine, clock: VirtualClock) -> list[RequestOutput]:
    """One step as the what-if replica runs it, every step STEP_S long."""
    outputs, batch = engine.begin_step()
    if batch.seqs:
        tokens = engine.runner.execute(batch)
        clock.advance(STEP_S)
        outputs += engine.end_step(batch, tokens)
    return outputs


def test_a_multi_step_run_delivers_its_tokens_together_when_it_ends() -> None:
    """vLLM 0.6: a run's outputs are processed once no steps remain (ten tokens arrive at once),
    and a request that reaches its length mid-run is answered at the run's end."""
    engine, clock = engine_with(prefill_first=True, scheduler_steps=4)
    a = engine.add_request("a", prompt_token_ids=[5] * 8, params=SamplingParams(max_tokens=6, ignore_eos=True))
    b = engine.add_request("b", prompt_token_ids=[5] * 8, params=SamplingParams(max_tokens=3, ignore_eos=True))
    assert {o.request_id for o in step(engine, clock)} == {"a", "b"}  # the prefill: a single step
    assert [step(engine, clock) for _ in range(3)] == [[], [], []]  # b ends in the 2nd: held
    delivered = step(engine, clock)  # the run's 4th step
    assert [(o.request_id, o.finished) for o in delivered] == [("a", False), ("b", False), ("a", False), ("b", True),
                                                               ("a", False), ("a", False)]  # fmt: skip
    end = clock.now()
    assert b.times.tokens == pytest.approx([STEP_S, end, end]) and b.times.finished == pytest.approx(end)
    assert a.times.tokens == pytest.approx([STEP_S, end, end, end, end])
    assert [o.request_id for o in step(engine, clock)] == ["a"]  # a new run; a's last token ends it
    assert a.times.finished == pytest.approx(clock.now()) and not engine.has_work()


def test_the_simulator_takes_the_policies_from_its_cli_and_they_cost_latency() -> None:
    args = ["run", "--model", "llama-3.1-8b", "--device", "a100", "--input-tokens", "200", "--output-tokens", "100",
            "--num-requests", "200", "--rate", "8", "--central-queue", "false"]  # fmt: skip
    mixed = simulate(spec_from(parser().parse_args(args)))
    spec = spec_from(parser().parse_args([*args, "--prefill-first", "true", "--scheduler-steps", "10"]))
    assert (spec.prefill_first, spec.scheduler_steps, spec.central_queue) == (True, 10, False)
    vllm06 = simulate(spec)
    assert vllm06["completed"] == mixed["completed"] == 200
    # An arrival waits for the run in flight (about half of ten steps) and stalls the decodes once.
    assert vllm06["ttft_p50_s"] > 2 * mixed["ttft_p50_s"]
    assert vllm06["tpot_p50_s"] > mixed["tpot_p50_s"]
    with pytest.raises(SimConfigError, match="--scheduler-steps"):
        spec_from(parser().parse_args([*args, "--scheduler-steps", "0"]))
    with pytest.raises(SimConfigError, match="--scheduler-steps"):
        simulate(SimSpec("llama-3.1-8b", "h100", gpus=2, pp=2, scheduler_steps=4, num_requests=4))
