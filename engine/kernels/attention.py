"""Attention over the paged KV cache: the torch implementation (the reference, and the CPU path
when the C++ op is not built) and the dispatcher that picks it, the C++ CPU op
(engine/kernels/cpu_attention.py) or the Triton kernels (engine/kernels/triton_attention.py).

Cache shape: k_cache, v_cache are [num_blocks, block_size, num_kv_heads, head_dim], of any
strides; a sequence's token at position p lives in block block_table[p // block_size], row
p % block_size. The engine stores the cache heads outermost ([KVH, num_blocks, block_size, D]
in memory) and passes `storage.permute(1, 2, 0, 3)`: the torch code permutes back for free, and
gathering one head's blocks then yields a contiguous [B, L, D] tensor that a batched matmul reads
as is (decode ran 1.5x faster on CPU than with heads innermost). The Triton kernels read through
the strides, so either layout works for them.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

Impl = Literal["torch", "triton", "cpu"]

# Decode rows per gather: smaller groups pad less but issue more (small) matmuls.
DECODE_GROUP = 16


def pick_impl(impl: Impl | None, tensor: torch.Tensor) -> Impl:
    """None picks by device: Triton on CUDA; on CPU the C++ op where it is built, else torch (CPU
    never imports triton)."""
    if impl is None:
        if tensor.is_cuda:
            return "triton"
        from engine.kernels import cpu_attention

        return "cpu" if tensor.device.type == "cpu" and cpu_attention.available() else "torch"
    if impl not in ("torch", "triton", "cpu"):
        raise ValueError(f"impl must be 'torch', 'triton', 'cpu' or None, got {impl!r}")
    if impl == "cpu":
        from engine.kernels import cpu_attention

        if not cpu_attention.available():  # loads the library the first time
            raise RuntimeError("impl='cpu': the C++ op is not built (`make kernels`) or SERVELAB_CPU_KERNELS=0")
    return impl


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    impl: Impl | None = None,
) -> None:
    """Write new tokens' K/V ([T, KVH, D]) into their slots (block_id * block_size + row)."""
    impl = pick_impl(impl, k)
    if impl == "cpu":
        from engine.kernels import cpu_attention

        cpu_attention.store_kv(k, v, k_cache, v_cache, slot_mapping)
        return
    if impl == "triton":
        from engine.kernels import triton_attention

        triton_attention.store_kv(k, v, k_cache, v_cache, slot_mapping)
        return
    for new, cache in ((k, k_cache), (v, v_cache)):
        # [num_blocks * block_size, KVH, D]; view, not reshape: a copy would silently drop the writes.
        if cache.dtype == torch.float8_e4m3fn:  # index_copy_ has no fp8 kernel: copy the bytes
            cache, new = cache.view(torch.uint8), new.to(cache.dtype).view(torch.uint8)
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slot_mapping, new)


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    impl: Impl | None = None,
) -> torch.Tensor:
    """One query token per sequence, attending to its first context_lens[b] cached tokens.
    q [B, H, D], block_tables [B, max_blocks], context_lens [B] (each >= 1) -> out [B, H, D].

    In torch: per KV head, gather that head's blocks of every sequence into a padded [B, L, D]
    tensor, then one batched matmul over the batch with the head's GQA group as the query rows
    (on CPU this ran several times faster than SDPA or one matmul over all heads). The gather is
    the cost, so rows go in groups of DECODE_GROUP, each padded only to its own longest
    sequence: with rows sorted by length (the runner sorts them) little padding is gathered."""
    impl = pick_impl(impl, q)
    if impl == "cpu":
        from engine.kernels import cpu_attention

        return cpu_attention.decode(q, k_cache, v_cache, block_tables, context_lens, scale)
    if impl == "triton":
        from engine.kernels import triton_attention

        return triton_attention.paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale)
    k_heads, v_heads = k_cache.permute(2, 0, 1, 3), v_cache.permute(2, 0, 1, 3)  # [KVH, num_blocks, bs, D]
    batch, num_heads, head_dim = q.shape
    num_kv_heads, _, block_size, _ = k_heads.shape
    group = num_heads // num_kv_heads
    out = torch.empty(num_kv_heads, batch, group, head_dim, dtype=q.dtype, device=q.device)
    # [KVH, B, group, D]: (head, sequence) pairs become one batch dimension of the matmuls.
    queries = q.view(batch, num_kv_heads, group, head_dim).transpose(0, 1)
    for start in range(0, batch, DECODE_GROUP):
        rows = slice(start, min(start + DECODE_GROUP, batch))
        lens = context_lens[rows]
        n = lens.shape[0]
        num_blocks = -(-int(lens.max()) // block_size)
        tables = block_tables[rows, :num_blocks].reshape(-1)
        max_len = num_blocks * block_size
        keys = _gather_blocks(k_heads, tables, q.dtype).view(num_kv_heads * n, max_len, head_dim)
        values = _gather_blocks(v_heads, tables, q.dtype).view(num_kv_heads * n, max_len, head_dim)
        scores = torch.bmm(queries[:, rows].reshape(-1, group, head_dim), keys.transpose(1, 2)).float()
        pad = torch.arange(max_len, device=q.device)[None, :] >= lens[:, None]
        scores.view(num_kv_heads, n, group, max_len).mul_(scale).masked_fill_(pad[None, :, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        out[:, rows] = torch.bmm(probs, values).view(num_kv_heads, n, group, head_dim)
    return out.transpose(0, 1).reshape(batch, num_heads, head_dim)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    num_cached: int,
    scale: float,
    impl: Impl | None = None,
) -> torch.Tensor:
    """One sequence's new chunk (q [n, H, D], k/v [n, KVH, D], already stored) attending to
    its cached prefix of num_cached tokens and causally to itself. Returns [n, H, D]."""
    impl = pick_impl(impl, q)
    if impl == "cpu":
        from engine.kernels import cpu_attention

        return cpu_attention.prefill(q, k_cache, v_cache, block_table, num_cached, scale)
    if impl == "triton":
        from engine.kernels import triton_attention

        return triton_attention.prefill_attention(q, k_cache, v_cache, block_table, num_cached, scale)
    n, _, head_dim = q.shape
    if num_cached == 0:
        keys, values, mask, causal = k.transpose(0, 1), v.transpose(0, 1), None, True
    else:
        kvh = k_cache.shape[2]
        total = num_cached + n
        keys = _gather_blocks(k_cache.permute(2, 0, 1, 3), block_table, q.dtype).view(kvh, -1, head_dim)[:, :total]
        values = _gather_blocks(v_cache.permute(2, 0, 1, 3), block_table, q.dtype).view(kvh, -1, head_dim)[:, :total]
        positions = torch.arange(total, device=q.device)
        mask = positions[None, :] <= positions[num_cached:, None]
        causal = False
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        keys[None],
        values[None],
        attn_mask=mask,
        is_causal=causal,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def _gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """cache [KVH, NB, bs, D] -> [KVH, len(block_ids), bs, D] in dtype. One index_select per head
    along dim 0 is a block memcpy; advanced indexing, or selecting along dim 1, ran 2-5x slower
    here. An fp8 cache (kv_cache_dtype) is widened to the queries' dtype once gathered."""
    stored = cache.dtype
    if stored == torch.float8_e4m3fn:  # index_select has no fp8 kernel: gather the bytes
        cache = cache.view(torch.uint8)
    out = torch.empty((cache.shape[0], block_ids.shape[0], *cache.shape[2:]), dtype=cache.dtype, device=cache.device)
    for h in range(cache.shape[0]):
        torch.index_select(cache[h], 0, block_ids, out=out[h])
    return out if stored == dtype else out.view(stored).to(dtype)
