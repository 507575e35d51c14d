"""Pipeline parallelism live: the layers split into stages, one process each (gloo point-to-point
between them), give HF's greedy tokens in float32, with overlap on and off, alone and with two
tensor-parallel ranks a stage; a stage that stops answering or dies fails the whole replica within
the collective timeout, every client told in-band, and no process is left behind."""

from __future__ import annotations

import itertools
import signal
from typing import Any

import pytest

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.errors import InvalidParamError
from tests.support.hf_check import check
from tests.support.replicas import gone, rank_fails_mid_stream
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def short_refs(hf_reference: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in hf_reference["prompts"] if len(r["prompt_ids"]) < 200][:4]


@pytest.mark.parametrize("overlap", [True, False])
def test_two_stages_match_the_hf_reference(hf_reference: dict[str, Any], overlap: bool, llm_fp32: LLM) -> None:
    llm = LLM(dtype="float32", pipeline_parallel=2, pipeline_overlap=overlap)
    pids = llm.engine.shard_group.pids
    try:
        check(llm, short_refs(hf_reference), hf_reference["max_new_tokens"])
        # Prompt logprobs need every row: that step's last stage sends the residual stream back.
        asked = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=1, logprobs=1)
        ids = short_refs(hf_reference)[0]["prompt_ids"]
        piped, whole = (m.generate([{"prompt_token_ids": ids}], asked)[0] for m in (llm, llm_fp32))
        assert piped.token_ids == whole.token_ids
        for a, b in zip(piped.prompt_logprobs[1:], whole.prompt_logprobs[1:]):
            assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-4)
        stats = llm.engine.stats()
        assert llm.engine.kv.num_used_blocks == 0
        records = llm.engine.step_records.take()
    finally:
        llm.engine.close()
    # Each batch's record says where each stage worked on it: in order, one stage after the other.
    spans = [r.stages for r in records]
    assert spans and all(len(s) == 2 and s[0][0] <= s[0][1] <= s[1][0] + 1e-3 and s[1][0] <= s[1][1] for s in spans)
    assert all(a[k][1] <= b[k][0] + 1e-3 for a, b in itertools.pairwise(spans) for k in (0, 1))  # a stage, batch after batch
    # The driver times its stage's forward to the logits coming back: inside each batch's span.
    assert all(0 < r.model_s < r.end - r.start for r in records)
    assert stats.pipeline_parallel == 2 and stats.pp_stage_layers == [15, 15]
    assert stats.tensor_parallel == 1 and stats.allreduces_per_step == 0
    first, second = stats.pp_stage_weight_bytes
    assert first == second  # the first holds the embeddings, the last the head: tied, the same bytes
    # Each stage's KV block holds its own 15 layers: half of the whole model's.
    assert stats.pp_stage_kv_block_bytes == [15 * 2 * 3 * 64 * 4 * 16] * 2
    assert len(stats.pp_stage_idle_share) == 2 and all(0 <= s <= 1 for s in stats.pp_stage_idle_share)
    assert wait_for(lambda: all(gone(pid) for pid in pids[1:]), 5)


def test_two_stages_of_two_tensor_parallel_ranks_match_the_hf_reference(hf_reference: dict[str, Any]) -> None:
    llm = LLM(dtype="float32", tensor_parallel=2, pipeline_parallel=2)
    pids = llm.engine.shard_group.pids
    try:
        assert len(pids) == 4
        check(llm, short_refs(hf_reference), hf_reference["max_new_tokens"])
        stats = llm.engine.stats()
    finally:
        llm.engine.close()
    assert stats.pipeline_parallel == 2 and stats.tensor_parallel == 2
    assert stats.allreduces_per_step == 2 * 15  # two a layer, rank 0's stage only
    assert wait_for(lambda: all(gone(pid) for pid in pids[1:]), 5)


def test_more_stages_than_layers_is_refused() -> None:
    with pytest.raises(InvalidParamError, match="pipeline_parallel"):
        EngineConfig(pipeline_parallel=0)
    with pytest.raises(InvalidParamError, match="pipeline_parallel"):
        LLM(dtype="float32", pipeline_parallel=31)


@pytest.mark.parametrize("how", [signal.SIGSTOP, signal.SIGKILL])
def test_a_stage_stopped_or_killed_fails_the_replica_within_15_s(hf_reference: dict[str, Any], how: int) -> None:
    rank_fails_mid_stream(EngineConfig(dtype="float32", pipeline_parallel=2), how, "pipeline stage 1", hf_reference)
