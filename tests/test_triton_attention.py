"""The Triton kernels against the torch implementation, and the engine running on them.

On CPU the kernels run in Triton's interpreter (tests/support/attention_cases.py switches it on before
the kernels are imported); SERVELAB_TEST_DEVICE=cuda runs the same tests on the GPU, in bf16 too.
Outputs are poisoned with NaN first, so an element a kernel fails to write fails the test. The
reference is the torch implementation over the same inputs in float32: in fp16/bf16 torch rounds
its scores and probabilities to that dtype while the kernels keep float32, so comparing the two
16-bit results would measure torch's rounding, not the kernels'.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.kernels import paged_attention_decode, prefill_attention, store_kv
from tests.support.attention_cases import DEVICE, DTYPES, TOLERANCE, cdiv, empty_cache, paged_batch, triton_attention

pytestmark = pytest.mark.integration


def assert_close(out: torch.Tensor, want: torch.Tensor) -> None:
    assert not out.isnan().any(), "an output element was not written"
    tol = TOLERANCE[out.dtype]
    torch.testing.assert_close(out.float(), want.to(out.dtype).float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.integers(1, 160), min_size=1, max_size=3),
    block_size=st.sampled_from([8, 16, 32, 64]),
    group=st.sampled_from([1, 3, 4]),
    num_kv_heads=st.sampled_from([1, 2]),
    head_dim=st.sampled_from([64, 128]),
    num_splits=st.sampled_from([None, 1, 2, 3]),
    heads_outer=st.booleans(),
    seed=st.integers(0, 10_000),
)
@example(lens=[1], block_size=16, group=3, num_kv_heads=1, head_dim=64, num_splits=None, heads_outer=True, seed=0)
@example(
    lens=[1, 17, 150], block_size=8, group=4, num_kv_heads=2, head_dim=128, num_splits=3, heads_outer=False, seed=1
)
def test_decode_matches_torch(
    dtype: torch.dtype,
    lens: list[int],
    block_size: int,
    group: int,
    num_kv_heads: int,
    head_dim: int,
    num_splits: int | None,
    heads_outer: bool,
    seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    b = paged_batch(lens, num_kv_heads, head_dim, block_size, dtype, gen, heads_outer)
    q = torch.randn(len(lens), num_kv_heads * group, head_dim, generator=gen).to(dtype).to(DEVICE)
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))
    triton_attention.paged_attention_decode(
        q, b.k_cache, b.v_cache, b.block_tables, b.context_lens, scale, out=out, num_splits=num_splits
    )
    caches = b.k_cache.float(), b.v_cache.float()
    want = paged_attention_decode(q.float(), *caches, b.block_tables, b.context_lens, scale, impl="torch")
    assert_close(out, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@settings(max_examples=25, deadline=None)
@given(
    cached=st.integers(0, 100),
    new=st.integers(1, 40),
    block_size=st.sampled_from([8, 16, 32, 64]),
    group=st.sampled_from([1, 3, 4]),
    head_dim=st.sampled_from([64, 128]),
    heads_outer=st.booleans(),
    seed=st.integers(0, 10_000),
)
@example(cached=0, new=1, block_size=16, group=3, head_dim=64, heads_outer=True, seed=0)
def test_prefill_over_cached_prefix_matches_torch(
    dtype: torch.dtype,
    cached: int,
    new: int,
    block_size: int,
    group: int,
    head_dim: int,
    heads_outer: bool,
    seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    kvh = 2
    b = paged_batch([cached + new], kvh, head_dim, block_size, dtype, gen, heads_outer)
    table = b.block_tables[0]
    q = torch.randn(new, kvh * group, head_dim, generator=gen).to(dtype).to(DEVICE)
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))
    triton_attention.prefill_attention(q, b.k_cache, b.v_cache, table, cached, scale, out=out)
    k, v = b.keys[0][cached:].float(), b.values[0][cached:].float()
    caches = b.k_cache.float(), b.v_cache.float()
    assert_close(out, prefill_attention(q.float(), k, v, *caches, table, cached, scale, impl="torch"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@settings(max_examples=10, deadline=None)
@given(
    num_tokens=st.integers(1, 40),
    block_size=st.sampled_from([8, 16, 64]),
    num_kv_heads=st.sampled_from([1, 3]),
    heads_outer=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_store_kv_matches_torch(
    dtype: torch.dtype, num_tokens: int, block_size: int, num_kv_heads: int, heads_outer: bool, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    d = 64
    num_blocks = cdiv(num_tokens, block_size) + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens].to(DEVICE)
    # K and V as the model makes them: strided views into one fused projection.
    qkv = torch.randn(num_tokens, 3 * num_kv_heads * d, generator=gen).to(dtype).to(DEVICE)
    k, v = (qkv[:, i * num_kv_heads * d : (i + 1) * num_kv_heads * d].view(-1, num_kv_heads, d) for i in (1, 2))
    caches = {}
    for impl in ("torch", "triton"):
        k_cache, v_cache = (empty_cache(num_blocks, block_size, num_kv_heads, d, dtype, heads_outer) for _ in range(2))
        k_cache.fill_(float("nan"))
        v_cache.fill_(float("nan"))
        store_kv(k, v, k_cache, v_cache, slots, impl=impl)
        caches[impl] = (k_cache, v_cache)
    for got, want in zip(caches["triton"], caches["torch"]):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


# Two short prompts from the recorded HF reference. Chunks of 24 tokens make step 2 a mixed one
# (a decode plus a prefill chunk over 8 cached tokens), then both decode: every kernel runs.
E2E_PROMPTS = ["list_weekdays", "code_list_literal"]


def test_engine_on_triton_kernels_matches_hf(hf_reference: dict[str, Any]) -> None:
    """The engine end to end with attention_impl="triton" (float32): greedy tokens equal to HF's.
    On CPU a tiny workload through the interpreter; on CUDA every reference prompt, also in chunks
    of 64 tokens and with a prefix-cache hit."""
    from engine import LLM, SamplingParams
    from tests.support.hf_check import check, expected

    refs = hf_reference["prompts"]
    if DEVICE == "cpu":
        llm = LLM(dtype="float32", block_size=8, max_batched_tokens=24)
        llm.engine.model.attention_impl = "triton"
        small = [r for r in refs if r["name"] in E2E_PROMPTS]
        greedy = SamplingParams(temperature=0, max_tokens=3)
        outs = llm.generate([{"prompt_token_ids": r["prompt_ids"]} for r in small], greedy)
        assert [o.token_ids for o in outs] == [expected(r)[:3] for r in small]
        assert llm.engine.num_steps == 4
        return
    max_new = hf_reference["max_new_tokens"]
    check(LLM(dtype="float32", device=DEVICE), refs, max_new)
    check(LLM(dtype="float32", device=DEVICE, max_batched_tokens=64), refs, max_new)
    shared = [r for r in refs if r["name"] in hf_reference["shared_prefix"]["prompts"]]
    llm = LLM(dtype="float32", device=DEVICE, block_size=16)
    check(llm, shared[:1], max_new)
    assert check(llm, shared[1:], max_new)[0].num_cached_tokens > 0


def test_warm_up_runs_each_split_k_variant_once_and_writes_nothing() -> None:
    """Serving never waits for Triton's compiler: every split count's power of two (the merge's
    SPLITS_PAD), no split, and a batch of one apart, run at warm-up (engine/worker/warm_up.py)."""
    k_cache = empty_cache(64, 16, 1, 64, torch.float32, True).zero_()
    v_cache = empty_cache(64, 16, 1, 64, torch.float32, True).zero_()
    before = k_cache.clone()
    # 64 blocks x 16 = 1,024 keys: at most 4 splits of 256 -> pads 0 (none), 2, 4; twice (batch 1, 2)
    assert triton_attention.warm_decode_variants(k_cache, v_cache, 3, 64) == 6
    assert torch.equal(k_cache, before)
