"""Checking the engine's greedy output against HF transformers' recorded one (tests/reference/
hf_greedy.json, the `hf_reference` fixture), up to the first near-tie."""

from __future__ import annotations

from typing import Any

from engine import LLM, SamplingParams

# Positions where HF's best two logits are closer than this are true near-ties: float32
# reductions in another order may pick either, so the comparison stops there.
TIE_MARGIN = 1e-3


def expected(ref: dict[str, Any]) -> list[int]:
    out = ref["output_ids"]
    for pos, margin in enumerate(ref["margins"]):
        if margin < TIE_MARGIN:
            return out[: pos + 1]
    return out


def check(llm: LLM, refs: list[dict[str, Any]], max_tokens: int) -> list[Any]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    outs = llm.generate([{"prompt_token_ids": r["prompt_ids"]} for r in refs], params)
    for ref, out in zip(refs, outs):
        want = expected(ref)
        assert out.token_ids[: len(want)] == want, ref["name"]
        if ref["stopped_on_eos"] and len(want) == len(ref["output_ids"]):
            assert out.finish_reason == "stop" and len(out.token_ids) == len(want), ref["name"]
    return outs
