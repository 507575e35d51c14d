"""The compiled forward (compile=True, engine/model/compile.py): greedy tokens still equal HF's in
float32 across batch shapes (all prompts together, chunks of 64, one sequence alone), and the one
graph serves them all: Dynamo never traces again after start-up, whose warm-up step writes no KV. One engine, one compile (the
Inductor cache under .cache/inductor makes a second run of this test load rather than compile)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine import LLM, SamplingParams
from engine.kernels import cpu_attention
from tests.support.hf_check import check, expected

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not cpu_attention.available(), reason="compile needs the C++ CPU op (make kernels)"),
]


def test_compiled_engine_matches_hf_without_retracing(hf_reference: dict[str, Any]) -> None:
    llm = LLM(dtype="float32", compile=True, max_batched_tokens=64)
    assert llm.engine.model.compiled_forward is not None
    # The start-up's warm-up step (a 64-token sequence over block 0) wrote nothing to the cache.
    assert all(not k.any() and not v.any() for k, v in llm.engine.runner.kv_caches)
    traced = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    check(llm, hf_reference["prompts"], hf_reference["max_new_tokens"])
    assert llm.engine.num_steps > 1507 // 64  # the long prompt went in chunks, beside decodes
    ref = hf_reference["prompts"][0]
    out = llm.generate([{"prompt_token_ids": ref["prompt_ids"]}], SamplingParams(temperature=0, max_tokens=8))[0]
    assert out.token_ids == expected(ref)[:8]  # batch 1: one token a step
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == traced, "Dynamo traced again"
