"""Shared by the attention tests: the device they run on, the Triton kernels, random paged
KV caches, and dense attention over unpaged K/V as the reference.

SERVELAB_TEST_DEVICE=cuda runs them on the GPU (bench/device_check runs its own cases). Otherwise they run on
CPU, the Triton kernels in Triton's interpreter, which has to be on before
engine.kernels.triton_attention is first imported (its kernels are built at import): tests take
the module from here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

DEVICE = os.environ.get("SERVELAB_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from engine.kernels import triton_attention  # after the interpreter is on

__all__ = [
    "DEVICE", "DTYPES", "TOLERANCE", "PagedBatch", "cdiv", "dense_attention", "empty_cache", "paged_batch",
    "triton_attention",
]  # fmt: skip

# Dtypes the kernels are tested in: the interpreter cannot do bf16 arithmetic, the GPU can.
DTYPES = [torch.bfloat16, torch.float16, torch.float32] if DEVICE == "cuda" else [torch.float16, torch.float32]
# Relative (and absolute) tolerance against a float32 computation over the same inputs.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class PagedBatch:
    k_cache: torch.Tensor  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, max_blocks] int32: shuffled, non-contiguous ids, 0-padded
    context_lens: torch.Tensor  # [B] int32
    keys: list[torch.Tensor]  # each sequence's unpaged K, [L, KVH, D]
    values: list[torch.Tensor]


def empty_cache(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, heads_outer: bool
) -> torch.Tensor:
    """A [num_blocks, block_size, KVH, D] cache: contiguous, or the engine's heads-outermost storage."""
    if heads_outer:
        storage = torch.empty(num_kv_heads, num_blocks, block_size, head_dim, dtype=dtype, device=DEVICE)
        return storage.permute(1, 2, 0, 3)
    return torch.empty(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=DEVICE)


def paged_batch(
    lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    heads_outer: bool = False,
) -> PagedBatch:
    """Random K/V for sequences of the given lengths, scattered into shuffled blocks. Every slot
    no sequence owns holds large garbage, so reading past a context shows in the output."""
    per_seq = [cdiv(n, block_size) for n in lens]
    num_blocks = sum(per_seq) + 3
    caches = []
    for _ in range(2):
        cache = empty_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, heads_outer)
        cache.copy_(100 * torch.randn(cache.shape, generator=gen))
        caches.append(cache)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables, keys, values = [], [], []
    for n, blocks in zip(lens, per_seq):
        table = [free.pop() for _ in range(blocks)]
        k, v = (torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE) for _ in range(2))
        pos = torch.arange(n, device=DEVICE)
        slots = torch.tensor(table, device=DEVICE)[pos // block_size] * block_size + pos % block_size
        for new, cache in ((k, caches[0]), (v, caches[1])):
            cache.view(-1, num_kv_heads, head_dim)[slots] = new
        tables.append(table)
        keys.append(k)
        values.append(v)
    width = max(per_seq)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=DEVICE)
    context_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    return PagedBatch(caches[0], caches[1], block_tables, context_lens, keys, values)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int | None) -> torch.Tensor:
    """q [n, H, D], k/v [L, KVH, D]; query i sees keys j <= i + offset (all keys if None)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.double(), k.double()) / q.shape[-1] ** 0.5
    if causal_offset is not None:
        n, length = q.shape[0], k.shape[0]
        mask = (
            torch.arange(length, device=q.device)[None, :] > torch.arange(n, device=q.device)[:, None] + causal_offset
        )
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v.double()).to(q.dtype)
