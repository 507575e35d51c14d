"""vLLM v0's admission watermark (EngineConfig.kv_watermark): greedy admission takes a waiting prompt
only when all of it fits with the watermark's share of the KV blocks left free, counting the blocks
still owed to prompts admitted earlier (here prompts take their blocks chunk by chunk). 0 is today's
rule, vLLM v1's: the first chunk's blocks are enough. The real Scheduler on a small block pool."""

from __future__ import annotations

import pytest

from engine.clock import VirtualClock
from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.errors import InvalidParamError
from engine.sim.__main__ import main
from engine.sim.run import simulate
from engine.sim.spec import SimSpec
from tests.support.scheduler_fakes import BS, fake_step, seq

pytestmark = pytest.mark.unit


def make(num_blocks: int, watermark: float, clock: VirtualClock) -> Scheduler:
    config = EngineConfig(block_size=BS, prefix_caching=False, max_batched_tokens=16, kv_watermark=watermark)
    return Scheduler(config, BlockManager(num_blocks, BS, enable_prefix_caching=False), clock)


def one_decoding_and_a_long_prompt(watermark: float) -> tuple[Scheduler, SchedulerOutput]:
    """20 blocks of 4 tokens: `a` decodes in 2 of them (18 free) when a 64-token prompt (16 blocks
    whole, its first chunk 4) arrives; the step that follows."""
    clock = VirtualClock()
    sched = make(20, watermark, clock)
    sched.add(seq("a", 7, clock, max_tokens=10))
    fake_step(sched)  # a's prompt: 2 blocks, then 8 tokens in them
    sched.add(seq("long", 64, clock))
    return sched, fake_step(sched)


def test_without_the_watermark_the_first_chunk_is_enough() -> None:
    _, out = one_decoding_and_a_long_prompt(0.0)
    assert [s.request_id for s in out.admitted] == ["long"]
    assert dict(zip([s.request_id for s in out.seqs], out.num_new_tokens)) == {"a": 1, "long": 15}


def test_the_watermark_holds_a_prompt_back_until_all_of_it_fits_with_the_watermark_left() -> None:
    """18 free - 16 for the whole prompt leaves 2: below 0.15 x 20 = 3 blocks it waits, at 0.10
    (2 blocks) it is admitted, as vLLM v0's can_allocate decides."""
    held, out = one_decoding_and_a_long_prompt(0.15)
    assert not out.admitted and [s.request_id for s in held.waiting] == ["long"]
    assert [s.request_id for s in out.seqs] == ["a"]
    _, out = one_decoding_and_a_long_prompt(0.10)
    assert [s.request_id for s in out.admitted] == ["long"]
    # Alone on the replica nothing else would free a block: it is admitted as soon as `a` is gone.
    held.remove(held.running[0])
    assert [s.request_id for s in fake_step(held).admitted] == ["long"]


def test_blocks_owed_to_a_prompt_part_way_through_its_prefill_count_as_taken() -> None:
    """32 blocks: `first` (64 tokens) has one 16-token chunk in 4 blocks and is in a pipeline stage
    when `second` (64 tokens) waits. 28 free - 12 owed to `first` - 16 leaves 0, below 0.05 x 32 = 1:
    held. Counting only the free blocks (28 - 16 = 12) would admit it, and without the watermark
    its first chunk is enough."""
    for watermark, admitted in ((0.05, []), (0.0, ["second"])):
        clock = VirtualClock()
        sched = make(32, watermark, clock)
        first = seq("first", 64, clock)
        sched.add(first)
        fake_step(sched)
        assert first.num_computed_tokens == 16 and len(first.block_table) == 4
        sched.add(seq("second", 64, clock))
        first.in_flight = True  # its batch is still in the pipeline's stages: no chunk this step
        assert [s.request_id for s in sched.schedule().admitted] == admitted


def test_a_long_context_greedy_run_preempts_far_less_with_the_watermark() -> None:
    """20 prompts of 8,000 tokens (2,000 out) at once on a KV cache that holds three or four whole
    requests: greedy admission starts every prompt its first chunk has room for, decodes then run out
    and preempt (each recomputing its prompt), and the preempted prompt starts again at once; with
    vLLM v0's watermark a prompt starts only when all of it fits."""
    spec = SimSpec("llama-3.1-8b", "h100", gpus=1, input_tokens=8000, output_tokens=2000, num_requests=20,
                   kv_budget_mb=4500, max_num_seqs=256)
    greedy = simulate(spec)
    watermark = simulate(SimSpec(**{**spec.__dict__, "kv_watermark": 0.01}))
    assert greedy["completed"] == watermark["completed"] == 20
    assert greedy["preemptions"] >= 100
    assert watermark["preemptions"] * 10 <= greedy["preemptions"]


@pytest.mark.parametrize("value", [1.0, -0.01, 1.5, "0.1", True, None])
def test_a_bad_watermark_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidParamError) as err:
        EngineConfig(kv_watermark=value)  # type: ignore[arg-type]
    assert err.value.param == "kv_watermark"


def test_the_simulator_takes_the_watermark_from_its_cli_and_refuses_a_bad_one(capsys: pytest.CaptureFixture) -> None:
    argv = ["run", "--model", "llama-3.1-8b", "--device", "h100", "--num-requests", "5", "--json"]
    assert main([*argv, "--kv-watermark", "0.01"]) == 0
    assert main([*argv, "--kv-watermark", "1"]) == 2
    assert "--kv-watermark must be in [0, 1)" in capsys.readouterr().err
