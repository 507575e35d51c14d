"""The torch paged-attention functions against dense attention over unpaged K/V (random
tensors: this checks the math and the paging, not the model), in both cache layouts: contiguous
[num_blocks, block_size, KVH, D] and the engine's heads-outermost storage seen through a view."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.kernels.attention import paged_attention_decode, prefill_attention, store_kv
from tests.support.attention_cases import DEVICE, cdiv, dense_attention, empty_cache, paged_batch

pytestmark = pytest.mark.unit


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(1, 70), min_size=1, max_size=4),
    block_size=st.sampled_from([4, 8, 16, 32, 64]),
    group=st.sampled_from([1, 3, 4]),
    head_dim=st.sampled_from([16, 64]),
    heads_outer=st.booleans(),
    seed=st.integers(0, 10_000),
)
@example(lens=[1], block_size=8, group=3, head_dim=16, heads_outer=True, seed=0)
def test_decode_matches_dense(
    lens: list[int], block_size: int, group: int, head_dim: int, heads_outer: bool, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    kvh = 2
    batch = paged_batch(lens, kvh, head_dim, block_size, torch.float32, gen, heads_outer)
    q = torch.randn(len(lens), kvh * group, head_dim, generator=gen).to(DEVICE)
    out = paged_attention_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, head_dim**-0.5, impl="torch"
    )
    for i in range(len(lens)):
        want = dense_attention(q[i : i + 1], batch.keys[i], batch.values[i], None)[0]
        torch.testing.assert_close(out[i], want, rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
    cached=st.integers(0, 40),
    new=st.integers(1, 30),
    block_size=st.sampled_from([4, 16]),
    heads_outer=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_prefill_over_cached_prefix_matches_dense(
    cached: int, new: int, block_size: int, heads_outer: bool, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    kvh, group, d = 2, 3, 16
    total = cached + new
    k, v = (torch.randn(total, kvh, d, generator=gen).to(DEVICE) for _ in range(2))
    num_blocks = cdiv(total, block_size) + 2
    # NaN everywhere the sequence does not write: attention must never read those slots.
    k_cache, v_cache = (empty_cache(num_blocks, block_size, kvh, d, torch.float32, heads_outer) for _ in range(2))
    k_cache.fill_(float("nan"))
    v_cache.fill_(float("nan"))
    table = torch.randperm(num_blocks, generator=gen)[: cdiv(total, block_size)].to(DEVICE)
    pos = torch.arange(total, device=DEVICE)
    store_kv(k, v, k_cache, v_cache, table[pos // block_size] * block_size + pos % block_size, impl="torch")
    q = torch.randn(new, kvh * group, d, generator=gen).to(DEVICE)
    out = prefill_attention(q, k[cached:], v[cached:], k_cache, v_cache, table, cached, d**-0.5, impl="torch")
    torch.testing.assert_close(out, dense_attention(q, k, v, cached), rtol=1e-5, atol=1e-5)


def test_impl_picked_by_device() -> None:
    from engine.kernels import cpu_attention, pick_impl

    # On CPU: the C++ op where it is built (make kernels), else the torch reference.
    assert pick_impl(None, torch.zeros(1)) == ("cpu" if cpu_attention.available() else "torch")
    assert pick_impl("torch", torch.zeros(1)) == "torch"
    assert pick_impl("triton", torch.zeros(1)) == "triton"
    if torch.cuda.is_available():
        assert pick_impl(None, torch.zeros(1, device="cuda")) == "triton"
