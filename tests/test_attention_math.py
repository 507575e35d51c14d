"""The torch paged-attention functions against dense attention over unpaged K/V (random
tensors: this checks the math and the paging, not the model)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kernels.attention import paged_attention_decode, prefill_attention, store_kv


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int | None) -> torch.Tensor:
    """q [n, H, D], k/v [L, KVH, D]; query i sees keys j <= i + offset (all keys if None)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.double(), k.double()) / q.shape[-1] ** 0.5
    if causal_offset is not None:
        n, length = q.shape[0], k.shape[0]
        mask = torch.arange(length)[None, :] > torch.arange(n)[:, None] + causal_offset
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v.double()).to(q.dtype)


def paged_copy(k: torch.Tensor, v: torch.Tensor, block_size: int, num_blocks: int, gen: torch.Generator):
    """Scatter one sequence's K/V into shuffled blocks of a fresh cache."""
    length, kvh, d = k.shape
    k_cache = torch.full((kvh, num_blocks, block_size, d), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    table = torch.randperm(num_blocks, generator=gen)[: -(-length // block_size)]
    pos = torch.arange(length)
    store_kv(k, v, k_cache, v_cache, table[pos // block_size] * block_size + pos % block_size)
    return k_cache, v_cache, table


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(1, 70), min_size=1, max_size=4),
    block_size=st.sampled_from([4, 8, 16]),
    group=st.sampled_from([1, 3, 4]),
    seed=st.integers(0, 10_000),
)
def test_decode_matches_dense(lens: list[int], block_size: int, group: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    kvh, d = 2, 16
    num_blocks = sum(-(-n // block_size) for n in lens) + 3
    k_cache = torch.zeros(kvh, num_blocks, block_size, d)
    v_cache = torch.zeros_like(k_cache)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables, ks, vs = [], [], []
    for n in lens:
        k, v = torch.randn(n, kvh, d, generator=gen), torch.randn(n, kvh, d, generator=gen)
        table = [free.pop() for _ in range(-(-n // block_size))]
        pos = torch.arange(n)
        store_kv(k, v, k_cache, v_cache, torch.tensor(table)[pos // block_size] * block_size + pos % block_size)
        tables.append(table)
        ks.append(k)
        vs.append(v)
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    q = torch.randn(len(lens), kvh * group, d, generator=gen)
    out = paged_attention_decode(q, k_cache, v_cache, block_tables, torch.tensor(lens), d**-0.5)
    for i in range(len(lens)):
        want = dense_attention(q[i : i + 1], ks[i], vs[i], None)[0]
        torch.testing.assert_close(out[i], want, rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
    cached=st.integers(0, 40), new=st.integers(1, 30), block_size=st.sampled_from([4, 16]), seed=st.integers(0, 10_000)
)
def test_prefill_over_cached_prefix_matches_dense(cached: int, new: int, block_size: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    kvh, group, d = 2, 3, 16
    total = cached + new
    k, v = torch.randn(total, kvh, d, generator=gen), torch.randn(total, kvh, d, generator=gen)
    k_cache, v_cache, table = paged_copy(k, v, block_size, -(-total // block_size) + 2, gen)
    q = torch.randn(new, kvh * group, d, generator=gen)
    out = prefill_attention(q, k[cached:], v[cached:], k_cache, v_cache, table, cached, d**-0.5)
    torch.testing.assert_close(out, dense_attention(q, k, v, cached), rtol=1e-5, atol=1e-5)
