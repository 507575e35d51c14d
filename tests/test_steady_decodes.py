"""Steady decodes (engine/core/steady_decodes.py) run a what-if replica's decodes as counts: every figure
of a run must be the one the step-by-step loops give. Whole simulations run both ways, their
results compared whole, on the paths the shortcut must fall back or hand over on: over capacity
(prompt chunks fill the budget every step), preemption, reserve admission and the watermark,
deadlines, a closed loop, uneven lengths, disaggregation, an autoscaled fleet and a lost replica."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.core.sequence import RequestTimes, Sequence
from engine.core.steady_decodes import SteadyDecodes
from engine.sampling_params import SamplingParams
from engine.sim import assembly
from engine.sim.run import SimSpec, simulate

pytestmark = pytest.mark.unit

SPECS = {
    "over": SimSpec("llama-3.1-70b", "h100", gpus=16, tp=8, dtype="fp8", kv_dtype="fp8", input_tokens=1000,
                    output_tokens=250, num_requests=1200, rate=280.0, seed=6),
    "preempt": SimSpec("llama-3.1-8b", "l4", gpus=2, tp=1, input_tokens=800, output_tokens=400,
                       input_range_ratio=0.5, num_requests=250, rate=45.0, seed=8),
    "reserve": SimSpec("llama-3.1-8b", "l4", gpus=1, tp=1, input_tokens=600, output_tokens=300,
                       num_requests=180, rate=18.0, admission="reserve", max_num_seqs=64, seed=9),
    "watermark": SimSpec("llama-3.1-8b", "l4", gpus=1, tp=1, input_tokens=3000, output_tokens=300,
                         input_range_ratio=0.5, num_requests=120, kv_watermark=0.01, seed=2),
    "deadline": SimSpec("llama-3.1-8b", "l4", gpus=1, tp=1, input_tokens=500, output_tokens=200,
                        num_requests=300, rate=40.0, deadline_s=5.0, seed=4),
    "closed": SimSpec("llama-3.1-8b", "h100", gpus=2, tp=1, dtype="fp8", input_tokens=300, output_tokens=500,
                      input_range_ratio=0.9, num_requests=400, concurrency=96, seed=5),
    "disagg": SimSpec("llama-3.1-8b", "h100", gpus=4, tp=1, dtype="fp8", input_tokens=500,
                      output_tokens=100, num_requests=250, rate=90.0, prefill_gpus=1, decode_gpus=3, seed=10),
    "autoscale": SimSpec("llama-3.1-8b", "h100", gpus=4, tp=1, dtype="fp8", input_tokens=400, output_tokens=300,
                         num_requests=600, rate=60.0, autoscale=True, max_replicas=4, burst_factor=3.0,
                         burst_at_s=2.0, burst_s=3.0),
    "killed": SimSpec("llama-3.1-8b", "h100", gpus=3, tp=1, dtype="fp8", input_tokens=400, output_tokens=300,
                      num_requests=400, rate=60.0, kill_replica_at_s=3.0),
}  # fmt: skip


def run(spec: SimSpec, steady: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr(assembly, "STEADY_DECODES", steady)
    made: list[SteadyDecodes] = []

    def counted(*args: Any) -> SteadyDecodes:
        made.append(SteadyDecodes(*args))
        return made[-1]

    monkeypatch.setattr(assembly, "SteadyDecodes", counted)
    result = simulate(spec)
    result["steady joins"] = sum(s.joins for s in made)
    result["steady releases"] = sum(s.releases for s in made)
    for key in ("wall_s", "sim_s_per_wall_s"):
        result.pop(key, None)
    return json.loads(json.dumps(result, sort_keys=True, default=str))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_run_says_the_same_with_and_without_steady_decodes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    step_by_step = run(SPECS[name], False, monkeypatch)
    counted = run(SPECS[name], True, monkeypatch)
    assert step_by_step["completed"] > 0
    joins = counted.pop("steady joins")
    # The shortcut was taken; not by a disaggregated fleet: its prefill replicas decode nothing, its
    # decode replicas find the KV they are handed through the prefix cache, which publishes per step.
    assert joins == 0 if name == "disagg" else joins > 0
    releases = counted.pop("steady releases")
    if name in ("preempt", "watermark"):
        assert releases > 0  # and it fell back where a step might preempt
    for key in ("steady joins", "steady releases"):
        assert step_by_step.pop(key) == 0
    differing = {k: (step_by_step[k], counted.get(k)) for k in step_by_step if step_by_step[k] != counted.get(k)}
    assert not differing, differing


def _decode(request_id: str, prompt: int, outputs: int, max_output: int) -> Sequence:
    seq = Sequence(request_id, range(prompt), SamplingParams(max_tokens=max_output), RequestTimes(0.0))
    seq.output_token_ids = [7] * outputs
    seq.num_computed_tokens = prompt + outputs - 1
    seq.max_output = max_output
    seq.times.first_token = 0.5
    seq.times.tokens = [0.5] * outputs
    return seq


def test_a_member_is_written_out_with_the_tokens_and_times_of_its_steps() -> None:
    steady = SteadyDecodes(token=100, block_size=16)
    seq = _decode("a", prompt=30, outputs=1, max_output=4)  # 30 computed: a block fills at 32
    seq.block_table = [0, 1]
    steady.join(seq)
    assert steady.context == 30
    assert steady.land(1.0) == []
    steady.sync()
    assert (seq.num_computed_tokens, seq.output_token_ids, seq.times.tokens) == (31, [7, 100], [0.5, 1.0])
    assert steady.context == 31
    assert steady.land(2.0) == []
    assert steady.growing() == [seq]  # its next token is the 33rd: a third block
    seq.block_table.append(2)
    steady.grew()
    assert steady.needs == {18: [seq]}  # and the 49th, a fourth
    assert steady.land(3.0) == [seq]  # its fourth token, the last
    assert (seq.num_computed_tokens, len(seq.output_token_ids), seq.times.tokens[-2:]) == (33, 4, [2.0, 3.0])
    assert len(steady) == 0 and steady.context == 0 and not steady.finishing and not steady.needs


def test_only_a_decode_whose_steps_are_all_alike_joins() -> None:
    steady = SteadyDecodes(token=100, block_size=16)
    assert steady.can_join(_decode("a", 20, 3, 10))
    assert not steady.can_join(_decode("b", 20, 0, 10))  # its prompt's last token: the first token is to come
    stops = _decode("c", 20, 3, 10)
    stops.stop_ids = frozenset({100})
    assert not steady.can_join(stops)
    strings = _decode("d", 20, 3, 10)
    strings.has_stop_strings = True
    assert not steady.can_join(strings)


def test_a_member_that_leaves_early_is_written_out_and_forgotten() -> None:
    steady = SteadyDecodes(token=100, block_size=16)
    seq = _decode("a", 20, 2, 50)
    steady.join(seq)
    steady.land(1.0)
    steady.leave(seq)
    assert (seq.num_computed_tokens, len(seq.output_token_ids)) == (22, 3)
    assert not steady.members and not steady.finishing and not steady.needs and steady.context == 0
