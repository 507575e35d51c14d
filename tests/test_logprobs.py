"""Logprobs, echo's prompt logprobs and the logits processors, checked against numbers computed
independently: a dense float32 forward of the engine's own weights over the whole sequence (no
paged cache, no chunking, no runner), softmaxed in float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.model.llama import Llama

pytestmark = pytest.mark.integration

TOL = 1e-3


@torch.inference_mode()
def reference_logits(model: Llama, ids: list[int]) -> torch.Tensor:
    """[T] token ids -> [T, V] float32 logits: plain causal attention over every position."""
    cfg = model.cfg
    t, d = len(ids), cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]

    def rope(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w

    h = model.embed.float()[torch.tensor(ids)]
    q_size, kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
    group = cfg.num_heads // cfg.num_kv_heads
    for layer in model.layers:
        qkv = norm(h, layer.input_norm.float()) @ layer.qkv.float().T
        q = rope(qkv[:, :q_size].view(t, cfg.num_heads, d)).transpose(0, 1)
        k = rope(qkv[:, q_size : q_size + kv_size].view(t, cfg.num_kv_heads, d)).transpose(0, 1)
        v = qkv[:, q_size + kv_size :].view(t, cfg.num_kv_heads, d).transpose(0, 1)
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(t, q_size)
        h = h + attn @ layer.o.float().T
        gate, up = (norm(h, layer.post_norm.float()) @ layer.gate_up.float().T).chunk(2, dim=-1)
        h = h + (F.silu(gate) * up) @ layer.down.float().T
    return norm(h, model.norm.float()) @ model.lm_head.float().T


def reference_logprobs(llm: LLM, ids: list[int]) -> torch.Tensor:
    return torch.log_softmax(reference_logits(llm.engine.model, ids), dim=-1)


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Water boils at a temperature of",
]


def test_logprobs_and_prompt_logprobs_match_a_float32_reference(llm_fp32: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=10, logprobs=5, prompt_logprobs=3, ignore_eos=True)
    for out in llm_fp32.generate(PROMPTS, params):
        prompt, output = out.prompt_token_ids, out.token_ids
        ref = reference_logprobs(llm_fp32, prompt + output[:-1])
        assert len(out.logprobs) == len(output) and len(out.prompt_logprobs) == len(prompt)
        for i, (token, lp) in enumerate(zip(output, out.logprobs)):
            row = ref[len(prompt) - 1 + i]
            assert lp.token_id == token and abs(lp.logprob - row[token].item()) < TOL, (out.text, i)
            # Greedy: the chosen token is the most likely one, the first of its top logprobs.
            assert lp.top[0] == (token, lp.logprob) and lp.logprob == max(v for _, v in lp.top)
            ref_top = row.topk(5).values.tolist()
            assert all(abs(a - b) < TOL for (_, a), b in zip(lp.top, ref_top)) and len(lp.top) == 5
        assert out.prompt_logprobs[0] is None
        for j in range(1, len(prompt)):
            lp = out.prompt_logprobs[j]
            assert lp.token_id == prompt[j] and abs(lp.logprob - ref[j - 1][prompt[j]].item()) < TOL, j
            assert len(lp.top) == 3 and abs(lp.top[0][1] - ref[j - 1].max().item()) < TOL


def test_prompt_logprobs_across_prefill_chunks_and_past_the_prefix_cache(llm_fp32: LLM) -> None:
    long_prompt = " ".join(f"item {i}," for i in range(40))  # > 100 tokens: several blocks and chunks
    ids = llm_fp32.tokenizer.encode(long_prompt)
    whole = llm_fp32.generate([ids], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=0))[0]
    # Now its blocks are cached: a second request with prompt logprobs must still compute them all.
    again = llm_fp32.generate([ids], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=0))[0]
    assert again.num_cached_tokens == 0 and len(again.prompt_logprobs) == len(ids)
    chunked = LLM(dtype="float32", max_batched_tokens=24, kv_budget_mb=64)
    try:
        split = chunked.generate([ids], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=0))[0]
    finally:
        chunked.engine.close()
    for a, b, c in zip(whole.prompt_logprobs[1:], again.prompt_logprobs[1:], split.prompt_logprobs[1:]):
        assert a.token_id == b.token_id == c.token_id
        assert abs(a.logprob - b.logprob) < 1e-4 and abs(a.logprob - c.logprob) < 1e-4


def test_penalties_pick_the_argmax_of_penalized_reference_logits(llm_fp32: LLM) -> None:
    prompt = llm_fp32.tokenizer.encode("apple, apple, apple, apple, apple,")
    plain = llm_fp32.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    p = SamplingParams(
        temperature=0,
        max_tokens=12,
        ignore_eos=True,
        repetition_penalty=1.3,
        presence_penalty=0.5,
        frequency_penalty=0.7,
    )
    out = llm_fp32.generate([prompt], p)[0]
    assert out.token_ids != plain.token_ids  # the penalties changed what greedy picks
    logits = reference_logits(llm_fp32.engine.model, prompt + out.token_ids[:-1])
    for i, token in enumerate(out.token_ids):
        row = logits[len(prompt) - 1 + i].clone()
        seen = torch.tensor(sorted(set(prompt + out.token_ids[:i])))
        row[seen] = torch.where(row[seen] > 0, row[seen] / 1.3, row[seen] * 1.3)
        counts = torch.bincount(torch.tensor(out.token_ids[:i], dtype=torch.long), minlength=row.numel()).float()
        row -= 0.7 * counts + 0.5 * (counts > 0).float()
        best, second = row.topk(2).values.tolist()
        if best - second > TOL:  # skip a near tie, which float rounding may break either way
            assert token == row.argmax().item(), i


def test_min_tokens_holds_back_eos_and_min_p_one_is_greedy(llm_fp32: LLM) -> None:
    chat = [{"role": "user", "content": "Say hi."}]
    short = llm_fp32.chat(chat, SamplingParams(temperature=0, max_tokens=40))[0]
    assert short.finish_reason == "stop" and len(short.token_ids) < 30
    held = llm_fp32.chat(chat, SamplingParams(temperature=0, max_tokens=40, min_tokens=30))[0]
    eos = set(llm_fp32.engine.eos_token_ids)
    assert len(held.token_ids) >= 30 and not eos & set(held.token_ids[:30])
    greedy = llm_fp32.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=8))[0]
    only_top = llm_fp32.generate(PROMPTS[:1], SamplingParams(temperature=1.0, min_p=1.0, seed=3, max_tokens=8))[0]
    assert only_top.token_ids == greedy.token_ids
