"""Speculative decoding as a lever: validated with the lever named, taken in place by a running
engine (live and simulated alike), and priced by the what-if fleet from an acceptance rate (its
guesses are blind; the cost model's seeded draw says how many stand)."""

from __future__ import annotations

import dataclasses

import pytest

from engine.clock import VirtualClock
from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.errors import InvalidParamError
from engine.lab.live_limits import check_live
from engine.lab.simulated.lab_check import check_sim
from engine.lab.simulated.lab_sim import SimLab
from engine.levers import LEVERS, validate_levers
from engine.sampling_params import SamplingParams
from engine.sim.deployment import Deployment, SimConfigError
from engine.sim.devices import get_device
from engine.sim.models import get_model
from engine.sim.run import simulate as run
from engine.sim.runner import SIM_TOKEN, CostModelRunner, sim_executor, step_shape
from engine.sim.spec import SimSpec

pytestmark = pytest.mark.unit

DEFAULTS = {key: lever.default for key, lever in LEVERS.items()}
EIGHT_B = DEFAULTS | {
    "executor": "sim", "model": "llama-3.1-8b", "device": "h100", "request_rate": 2.0, "prompt_tokens": 1000,
    "output_tokens": 300, "max_num_seqs": 256, "max_batched_tokens": 8192, "queue_cap": 1000,
}  # fmt: skip


def test_bad_values_are_refused_with_the_lever_named() -> None:
    for bad in ({"num_speculative_tokens": 9}, {"num_speculative_tokens": -1}, {"spec_acceptance": 1.5}):
        with pytest.raises(InvalidParamError) as err:
            validate_levers(bad)
        assert err.value.param == next(iter(bad))
    with pytest.raises(InvalidParamError) as err:
        validate_levers({"spec_lookup_min": 5, "spec_lookup_max": 3})
    assert err.value.param == "spec_lookup_min"


def test_the_live_engine_refuses_speculation_where_it_cannot_run_naming_the_lever_moved() -> None:
    on = DEFAULTS | {"num_speculative_tokens": 4}
    check_live({"num_speculative_tokens": 4}, on, devices=2)  # the paged scheduler, one stage: fine
    with pytest.raises(InvalidParamError) as err:
        check_live({"pipeline_parallel": 2}, on | {"pipeline_parallel": 2}, devices=2)
    assert err.value.param == "pipeline_parallel" and "one pipeline stage" in err.value.message
    with pytest.raises(InvalidParamError) as err:
        check_live({"num_speculative_tokens": 4}, on | {"paged": False}, devices=2)
    assert err.value.param == "num_speculative_tokens"
    with pytest.raises(InvalidParamError) as err:
        check_live({"spec_lookup_max": 1}, DEFAULTS | {"spec_lookup_max": 1}, devices=2)  # under lookup_min 2
    assert err.value.param == "spec_lookup_max"


def test_the_simulator_refuses_it_with_its_own_reason_next_to_the_lever() -> None:
    with pytest.raises(InvalidParamError) as err:
        check_sim(EIGHT_B | {"num_speculative_tokens": 4, "paged": False}, {"num_speculative_tokens": 4})
    assert err.value.param == "num_speculative_tokens" and "paged scheduler" in err.value.message
    with pytest.raises(SimConfigError, match="from 0 to 1"):
        Deployment(get_model("llama-3.1-8b"), get_device("h100"), spec_acceptance=-0.1)


def test_a_running_engine_takes_the_lever_in_place_and_drops_guesses_made_for_the_old_count() -> None:
    config = EngineConfig(max_num_seqs=8, max_batched_tokens=256, num_speculative_tokens=4)
    dep = Deployment(get_model("llama-3.1-8b"), get_device("h100"), spec_acceptance=1.0)
    engine = LLMEngine(config, VirtualClock(), sim_executor(dep, config))
    engine.add_request("a", params=SamplingParams(max_tokens=60, ignore_eos=True), prompt_token_ids=list(range(40)))
    engine.step()  # the prefill's token, then four guesses
    engine.step()  # all four stand, and the model's own token
    seq = engine.requests["a"]
    assert len(seq.output_token_ids) == 1 + 5 and seq.spec_token_ids == (SIM_TOKEN,) * 4
    engine.reconfigure(num_speculative_tokens=0)
    assert seq.spec_token_ids == ()
    before = len(seq.output_token_ids)
    engine.step()
    assert len(seq.output_token_ids) == before + 1  # a plain decode: one token
    engine.reconfigure(num_speculative_tokens=2)
    engine.step()  # no guess to check yet (they are made after a step)
    engine.step()
    assert len(seq.output_token_ids) == before + 1 + 1 + 3
    assert engine.stats().spec_draft_tokens == 4 + 2 and engine.stats().spec_accepted_tokens == 4 + 2


def test_a_verify_step_is_priced_as_a_chunk_with_a_sampled_row_per_guess() -> None:
    config = EngineConfig(max_num_seqs=8, max_batched_tokens=256, num_speculative_tokens=3)
    dep = Deployment(get_model("llama-3.1-8b"), get_device("h100"))
    engine = LLMEngine(config, VirtualClock(), sim_executor(dep, config))
    engine.add_request("a", params=SamplingParams(max_tokens=60, ignore_eos=True), prompt_token_ids=list(range(40)))
    engine.step()
    engine.step()  # decodes its second token and makes three guesses
    batch = engine.scheduler.schedule()
    shape, tokens = step_shape(batch, lambda k: 2)
    assert batch.num_new_tokens == [4]
    assert shape.num_tokens == 4 and shape.num_sampled == 4 and shape.num_decodes == 0
    assert tokens == {"a": [SIM_TOKEN] * 3}


def test_the_acceptance_draw_keeps_its_rate_and_its_seed() -> None:
    cost = sim_executor(Deployment(get_model("llama-3.1-8b"), get_device("h100")), EngineConfig()).runner.cost
    runner = CostModelRunner(cost, spec_acceptance=0.6, seed=3)  # type: ignore[attr-defined]
    draws = [runner._accepted(4) for _ in range(40_000)]
    a = 0.6
    assert sum(draws) / len(draws) == pytest.approx((a - a**5) / (1 - a), abs=0.02)  # E[run of a's, capped at 4]
    again = CostModelRunner(cost, spec_acceptance=0.6, seed=3)  # type: ignore[attr-defined]
    assert [again._accepted(4) for _ in range(100)] == draws[:100]


def test_at_low_load_speculation_cuts_time_per_token_by_the_tokens_a_step_makes() -> None:
    base = SimSpec(
        model="llama-3.1-8b", device="h100", gpus=1, rate=1.0, num_requests=40, input_tokens=1000, output_tokens=300
    )
    plain = run(base)
    fast = run(dataclasses.replace(base, spec_tokens=4, spec_acceptance=0.6))
    per_step = (1 - 0.6**5) / (1 - 0.6)  # 2.31 tokens a verify step, at the same weight read
    assert plain["tpot_p50_s"] / fast["tpot_p50_s"] == pytest.approx(per_step, rel=0.15)
    assert fast["completed"] == plain["completed"] == 40


def test_at_high_load_on_short_prompts_the_guesses_cost_more_than_they_save() -> None:
    base = SimSpec(
        model="llama-3.1-8b", device="h100", gpus=1, rate=64.0, num_requests=600, input_tokens=200, output_tokens=300
    )
    plain, spec = run(base), run(dataclasses.replace(base, spec_tokens=4, spec_acceptance=0.6))
    assert spec["tpot_p50_s"] > 1.2 * plain["tpot_p50_s"]  # compute-bound: 5 tokens of work for 2.3
    assert spec["output_tok_s"] < plain["output_tok_s"]


def test_the_simulated_lab_moves_it_in_place_and_rebuilds_for_a_new_acceptance() -> None:
    lab = SimLab(EIGHT_B, lambda snap: None)
    assert not lab.needs_rebuild({"num_speculative_tokens": 4}) and lab.needs_rebuild({"spec_acceptance": 0.8})
    lab.apply({"num_speculative_tokens": 4})
    assert all(r.engine.config.num_speculative_tokens == 4 for r in lab.fleet.replicas)  # type: ignore[attr-defined]
    lab.start_traffic()
    lab.loop.run(until=lab.clock.now() + 20.0)
    stats = [r.engine.stats() for r in lab.fleet.replicas]  # type: ignore[attr-defined]
    assert sum(s.spec_checks for s in stats) > 100
    accepted = sum(s.spec_accepted_tokens for s in stats) / sum(s.spec_draft_tokens for s in stats)
    assert 0.3 < accepted < 0.6  # each guess stands at 0.6 once those before it did
    snap = lab._latest  # the live stream's snapshot: the same shares over its window
    assert snap is not None and snap.spec_acceptance is not None and snap.spec_tokens_per_step is not None
    assert 0.3 < snap.spec_acceptance < 0.6 and 1.8 < snap.spec_tokens_per_step < 2.8  # 2.31 expected at k = 4
    text = lab.fleet.metrics_text()
    drafts = next(line for line in text.splitlines() if line.startswith("vllm:spec_decode_num_draft_tokens_total"))
    assert int(drafts.split()[-1]) == sum(s.spec_draft_tokens for s in stats)
    assert "vllm:spec_decode_num_accepted_tokens_total" in text and "vllm:spec_decode_num_drafts_total" in text


def test_nothing_speculated_reads_as_no_figure_not_zero() -> None:
    lab = SimLab(EIGHT_B, lambda snap: None)
    lab.start_traffic()
    lab.loop.run(until=lab.clock.now() + 5.0)
    assert lab._latest is not None and lab._latest.spec_acceptance is None and lab._latest.spec_tokens_per_step is None


def test_a_remote_lab_says_why_it_cannot_send_prompts_in_words() -> None:
    from engine.lab.remote.remote_levers import belongs_to_remote

    assert "tokenizer" in belongs_to_remote("prompt_style", "vLLM")
    assert "belongs to the remote server" in belongs_to_remote("num_speculative_tokens", "vLLM")
    assert "ngram" in belongs_to_remote("num_speculative_tokens", "vLLM")


def test_a_draft_model_costs_k_passes_of_its_share_of_each_step() -> None:
    """Leviathan et al.'s c: k guesses take k draft passes, each c of the target's step."""
    base = SimSpec(
        model="llama-3.1-70b", device="h100", gpus=4, tp=4, rate=1.0, num_requests=40, input_tokens=1000,
        output_tokens=200, spec_tokens=4, spec_acceptance=0.7,
    )
    free, drafted = run(base), run(dataclasses.replace(base, spec_draft_cost=0.05))
    assert drafted["tpot_p50_s"] / free["tpot_p50_s"] == pytest.approx(1 + 4 * 0.05, rel=0.06)
    with pytest.raises(SimConfigError, match="draft cost"):
        dataclasses.replace(base, spec_draft_cost=1.5).deployment()
