"""The batch_invariant row of /failures (issue 15, part B) on the real model: the same prompt alone
and inside a full batch. Off, its logits differ bitwise (oneDNN's bf16 GEMM here blocks M > 32
rows differently from M <= 32, so a token's reduction order depends on how many tokens share its
step); on, every matmul runs in fixed tiles of 32 rows and the logits are bitwise identical, and
no greedy generation changes a token between alone and batched. bench/batch_invariance.py counts
the changed generations over 100 prompts and measures what the lever costs. Both dtypes: MKL's
fp32 GEMM depends on M at almost every size, and fixed 32-row tiles fix it too."""

from __future__ import annotations

import pytest
import torch

from engine.llm import LLM
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

BATCH = 16  # a full batch: max_num_seqs below
PROMPTS = [
    f"Question {i}: in one sentence, what is special about the number {i * 7} and the colour {colour}?"
    for i, colour in zip(range(BATCH), ["red", "blue", "green", "teal"] * 4)
]


def first_logits(engine: LLMEngine, prompts: list[str], tag: str) -> torch.Tensor:
    """The raw logits (the model's dtype) of prompts[0]'s first sampled token, run with all of prompts in one batch."""
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    for request_id, text in zip(ids, prompts):
        engine.add_request(request_id, text, SamplingParams(temperature=0, max_tokens=1))
    found: torch.Tensor | None = None
    while engine.has_work():
        engine.step()
        assert engine.runner.last_logits is not None
        rows, logits = engine.runner.last_logits
        if ids[0] in rows and found is None:
            found = logits[rows.index(ids[0])].clone()
    assert found is not None
    return found


def changed_generations(llm: LLM, prompts: list[str], max_tokens: int) -> int:
    """How many greedy generations differ in any token between run alone and run all together."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    alone = [llm.generate(p, params)[0].token_ids for p in prompts]
    together = [out.token_ids for out in llm.generate(prompts, params)]
    return sum(a != b for a, b in zip(alone, together))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("invariant", [False, True], ids=["off", "on"])
def test_batch_invariant_logits_alone_and_in_a_full_batch(invariant: bool, dtype: str) -> None:
    llm = LLM(batch_invariant=invariant, dtype=dtype, max_num_seqs=BATCH, kv_budget_mb=64, num_threads=1)
    try:
        engine = llm.engine
        alone = first_logits(engine, PROMPTS[:1], f"alone-{invariant}")
        in_batch = first_logits(engine, PROMPTS, f"batch-{invariant}")
        assert alone.dtype == in_batch.dtype and alone.shape == in_batch.shape  # the model's dtype
        if invariant:
            assert torch.equal(alone, in_batch)  # bitwise
            if dtype == "bfloat16":  # the default; the bench counts over 100 prompts
                assert changed_generations(llm, PROMPTS[:6], 8) == 0
        else:  # the failure, shown real on this machine (bf16 differs by up to 0.25 here, fp32 by ~2e-5)
            assert not torch.equal(alone, in_batch)
        assert not engine.has_work() and engine.kv.num_used_blocks == 0
    finally:
        llm.engine.close()
