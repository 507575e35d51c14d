"""Tensor parallelism: two ranks (gloo on CPU) give HF's greedy output token for token, and a rank
that stops answering fails the whole group within 15 s, leaving no process behind."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import torch

from engine import LLM
from engine.config import EngineConfig
from engine.errors import InvalidParamError
from engine.model.llama import Llama, LlamaConfig
from engine.model.partition import split_evenly
from engine.model.sharding import shard_model
from tests.support.hf_check import check
from tests.support.replicas import gone, rank_fails_mid_stream
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def test_heads_split_by_kv_group_unevenly_and_mlp_evenly() -> None:
    assert split_evenly(3, 2) == [(0, 2), (2, 3)] and split_evenly(1536, 2) == [(0, 768), (768, 1536)]
    cfg = LlamaConfig(100, 64, 96, 2, num_heads=9, num_kv_heads=3, head_dim=8, rms_norm_eps=1e-5, rope_theta=1e4,
                      max_position=32)  # fmt: skip
    shards = []
    for rank in range(2):
        with torch.device("meta"):
            shards.append(shard_model(Llama(cfg), rank, 2))
    assert [(s.cfg.num_heads, s.cfg.num_kv_heads, s.cfg.intermediate_size) for s in shards] == [(6, 2, 48), (3, 1, 48)]
    layer = shards[1].layers[0]
    assert layer.qkv.shape == ((3 + 2) * 8, 64) and layer.o.shape == (64, 3 * 8)
    assert layer.gate_up.shape == (2 * 48, 64) and layer.down.shape == (64, 48)
    with torch.device("meta"), pytest.raises(InvalidParamError, match="tensor_parallel"):
        shard_model(Llama(cfg), 0, 4)
    with pytest.raises(InvalidParamError, match="tensor_parallel"):
        EngineConfig(tensor_parallel=0)


def test_two_ranks_match_the_hf_reference(hf_reference: dict[str, Any]) -> None:
    refs = [r for r in hf_reference["prompts"] if len(r["prompt_ids"]) < 200][:3]
    llm = LLM(dtype="float32", tensor_parallel=2)
    pids = llm.engine.shard_group.pids
    try:
        check(llm, refs, hf_reference["max_new_tokens"])
        stats = llm.engine.stats()
        records = llm.engine.step_records.take()
    finally:
        llm.engine.close()
    # Rank 0 times the forward with its all-reduces, so the other rank's work: inside each step.
    assert records and all(0 < r.model_s < r.end - r.start for r in records)
    assert stats.tensor_parallel == 2 and stats.allreduces_per_step == 2 * llm.engine.model_cfg.num_layers
    assert stats.allreduce_ms_per_step > 0
    rank0, rank1 = stats.tp_rank_weight_bytes
    assert rank0 > rank1  # rank 0 holds 2 of the 3 KV groups
    assert stats.kv_bytes_per_token == 2 * 30 * 2 * 64 * 4  # rank 0's 2 KV heads, float32
    assert wait_for(lambda: all(gone(pid) for pid in pids[1:]), 5)


def test_sigstop_one_rank_fails_the_group_within_15_s(hf_reference: dict[str, Any]) -> None:
    rank_fails_mid_stream(EngineConfig(dtype="float32", tensor_parallel=2), signal.SIGSTOP, "rank 1", hf_reference)
