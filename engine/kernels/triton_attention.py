"""Paged attention in Triton: the GPU path of engine/kernels/attention.py (same functions, same
shapes; the torch implementation there is the reference the tests hold these to).

One kernel serves decode and prefill. A program owns one sequence, one KV head and a block of
BLOCK_M query rows, where a row is a (query token, query head of that KV head's GQA group) pair:
the group's heads share every K/V tile the program loads. It walks the sequence's keys a tile of
TILE_N tokens at a time, gathering each token's row through the block table, with an online
softmax in fp32. Decode has one query token per sequence, so its rows are the GQA group; a long
context can be cut into splits (split-K) that run as separate programs and are merged by a second
kernel, so that a small batch still fills the GPU.

Inputs may be fp32, fp16 or bf16; 16-bit tiles are upcast in-kernel (the Triton interpreter, which
the CPU tests run, cannot do bf16 arithmetic) and the dots use TF32, which holds fp16/bf16 values
exactly, so accumulation is fp32 throughout. fp32 inputs use IEEE dots so fp32 stays fp32.

Set TRITON_INTERPRET=1 before importing this module to run it on CPU tensors (slowly).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

INTERPRETED = bool(triton.knobs.runtime.interpret)  # read when the kernels below are decorated
TILE_N = 32  # keys per step of the online softmax (tl.dot needs >= 16)
PREFILL_BLOCK_M = 64  # query rows per prefill program
MIN_SPLIT_LEN = 256  # decode keys per split-K program at least: below that the merge costs more
LOG2E = 1.4426950408889634


# Integers that change from call to call are not specialised on: one compiled kernel serves them.
@triton.jit(do_not_specialize=["query_len", "split_len", "num_splits"])
def _attention_kernel(
    out_ptr,
    part_acc_ptr,  # split-K partials: unnormalised output, running max, running sum
    part_max_ptr,
    part_sum_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    scale_log2,  # softmax scale * log2(e): the kernel exponentiates with exp2
    query_len,  # query tokens per sequence, the last ones of its context (decode: 1)
    block_size,
    split_len,  # keys per split
    num_splits,
    num_heads,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_cr,
    stride_ch,
    stride_bt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    row_block = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits

    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    token = rows // GROUP  # query token within the sequence
    head = kv_head * GROUP + rows % GROUP
    row_ok = token < query_len
    dims = tl.arange(0, HEAD_DIM)

    context_len = tl.load(context_lens_ptr + seq)
    q_pos = context_len - query_len + token  # a query sees the keys at positions <= its own
    last_token = tl.minimum((row_block * BLOCK_M + BLOCK_M - 1) // GROUP, query_len - 1)
    lo = split * split_len
    hi = tl.minimum(tl.minimum(context_len, context_len - query_len + last_token + 1), lo + split_len)

    q_tok = seq * query_len + token
    q_rows = q_ptr + q_tok[:, None] * stride_qt + head[:, None] * stride_qh
    q = tl.load(q_rows + dims[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    max_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    sum_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    table = block_tables_ptr + seq * stride_bt
    head_offset = kv_head.to(tl.int64) * stride_ch  # int64: a head's stride can pass 2**31 elements
    # Every row sees a key in the first tile (key lo is visible to all rows: prefill starts at
    # key 0, decode rows see their whole context), so the running max is finite from then on.
    for start in range(lo, hi, TILE):
        keys = start + tl.arange(0, TILE)
        key_ok = keys < hi
        block = tl.load(table + keys // block_size, mask=key_ok, other=0).to(tl.int64)  # int64: big caches
        offs = block * stride_cb + (keys % block_size) * stride_cr + head_offset
        k = tl.load(k_cache_ptr + offs[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + offs[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0).to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        visible = key_ok[None, :] & (keys[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(max_i, tl.max(scores, axis=1))
        alpha = tl.exp2(max_i - new_max)
        p = tl.exp2(scores - new_max[:, None])
        sum_i = sum_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        max_i = new_max

    if SPLIT:
        if lo < hi:  # splits past this sequence's context write nothing; the merge skips them
            part = (q_tok * num_heads + head) * num_splits + split
            tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc, mask=row_ok[:, None])
            tl.store(part_max_ptr + part, max_i, mask=row_ok)
            tl.store(part_sum_ptr + part, sum_i, mask=row_ok)
    else:
        out = acc / sum_i[:, None]
        dst = out_ptr + q_tok[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit(do_not_specialize=["split_len", "num_splits"])
def _merge_splits_kernel(
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    context_lens_ptr,
    split_len,
    num_splits,
    num_heads,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    """Decode only: one program per (sequence, query head) combines that row's splits."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    used = splits < tl.cdiv(tl.load(context_lens_ptr + seq), split_len)
    part = (seq * num_heads + head) * num_splits + splits
    maxes = tl.load(part_max_ptr + part, mask=used, other=float("-inf"))
    weights = tl.exp2(maxes - tl.max(maxes, axis=0))  # 0 for unused splits
    total = tl.sum(tl.load(part_sum_ptr + part, mask=used, other=0.0) * weights, axis=0)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], mask=used[:, None], other=0.0)
    out = tl.sum(acc * weights[:, None], axis=0) / total
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty))


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    block_size,
    num_kv_heads,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cr,
    stride_ch,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
):
    """One program per new token: its K and V rows of every KV head into its cache slot."""
    token = tl.program_id(0)
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    ok = (heads < num_kv_heads)[:, None]
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    row = (slot // block_size) * stride_cb + (slot % block_size) * stride_cr
    dst = row + heads[:, None].to(tl.int64) * stride_ch + dims[None, :]
    k = tl.load(k_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=ok)
    v = tl.load(v_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=ok)
    tl.store(k_cache_ptr + dst, k, mask=ok)
    tl.store(v_cache_ptr + dst, v, mask=ok)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write new tokens' K/V ([T, KVH, D]) into their slots (block_id * block_size + row)."""
    _check(k, k_cache, v_cache)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1, "K/V rows must be contiguous"
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k_cache.shape[1],
        num_kv_heads,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        *k_cache.stride()[:3],
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
    )


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """q [B, H, D] -> out [B, H, D] (written into `out` if given). num_splits: split-K programs
    per (sequence, KV head); None picks enough to fill the GPU (1 under the interpreter)."""
    batch, num_kv_heads = q.shape[0], k_cache.shape[2]
    # The block table's width bounds every context from the host, without reading context_lens
    # back from the GPU (a sync per layer).
    max_context = block_tables.shape[1] * k_cache.shape[1]
    if num_splits is None:
        num_splits = _default_num_splits(q.device, batch * num_kv_heads, max_context)
    split_len = triton.cdiv(triton.cdiv(max_context, max(num_splits, 1)), TILE_N) * TILE_N
    num_splits = triton.cdiv(max_context, split_len)
    return _attend(q, k_cache, v_cache, block_tables, context_lens, scale, 1, split_len, num_splits, out)


def warm_decode_variants(k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int, max_blocks: int) -> int:
    """Compile every decode variant serving can meet, before it meets it: split-K's merge is
    specialised on the split count's power of two (SPLITS_PAD), no split is another kernel, and a
    batch of one is specialised apart; the first request to need a new one would wait for Triton's
    compiler mid-serving. It reads block 0 and writes nothing. Returns how many variants ran."""
    block_size, _, head_dim = k_cache.shape[1:]
    max_context = max_blocks * block_size
    seen: set[tuple[int, int]] = set()
    for batch in (1, 2):
        q = torch.zeros(batch, num_heads, head_dim, dtype=k_cache.dtype, device=k_cache.device)
        tables = torch.zeros(batch, max_blocks, dtype=torch.int32, device=k_cache.device)
        lens = torch.ones(batch, dtype=torch.int32, device=k_cache.device)
        for splits in range(1, max(1, max_context // MIN_SPLIT_LEN) + 1):
            split_len = triton.cdiv(triton.cdiv(max_context, splits), TILE_N) * TILE_N
            used = triton.cdiv(max_context, split_len)
            key = (batch, triton.next_power_of_2(used) if used > 1 else 0)
            if key not in seen:
                seen.add(key)
                paged_attention_decode(q, k_cache, v_cache, tables, lens, 1.0, num_splits=splits)
    return len(seen)


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    num_cached: int,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One sequence's chunk q [n, H, D], its K/V already stored, attending to its num_cached
    cached tokens and causally to itself: every key is read from the paged cache."""
    n = q.shape[0]
    context_len = torch.full((1,), num_cached + n, dtype=torch.int32, device=q.device)  # a fill, no host copy
    return _attend(q, k_cache, v_cache, block_table.view(1, -1), context_len, scale, n, num_cached + n, 1, out)


def _attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    query_len: int,
    split_len: int,
    num_splits: int,
    out: torch.Tensor | None,
) -> torch.Tensor:
    _check(q, k_cache, v_cache)
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = num_tokens // query_len
    num_kv_heads = k_cache.shape[2]
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert q.stride(-1) == 1, "query rows must be contiguous"
    group = num_heads // num_kv_heads
    out = torch.empty_like(q) if out is None else out
    assert out.shape == q.shape and out.stride(-1) == 1
    block_m = max(16, triton.next_power_of_2(group)) if query_len == 1 else PREFILL_BLOCK_M
    row_blocks = triton.cdiv(query_len * group, block_m)
    split = num_splits > 1
    assert not split or query_len == 1, "split-K is for decode"
    if split:
        part_acc = torch.empty(num_tokens * num_heads * num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_max = torch.empty(num_tokens * num_heads * num_splits, dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
    else:
        part_acc = part_max = part_sum = out  # unused
    _attention_kernel[(num_seqs, num_kv_heads, row_blocks * num_splits)](
        out,
        part_acc,
        part_max,
        part_sum,
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        scale * LOG2E,
        query_len,
        k_cache.shape[1],
        split_len,
        num_splits,
        num_heads,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        *k_cache.stride()[:3],
        block_tables.stride(0),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        TILE=TILE_N,
        SPLIT=split,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4 if query_len == 1 else 8,  # a prefill tile holds 4x the rows of a decode one
    )
    if split:
        _merge_splits_kernel[(num_seqs, num_heads)](
            out,
            part_acc,
            part_max,
            part_sum,
            context_lens,
            split_len,
            num_splits,
            num_heads,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
        )
    return out


def _default_num_splits(device: torch.device, programs: int, max_context: int) -> int:
    """About four programs per SM, none shorter than MIN_SPLIT_LEN keys."""
    if device.type != "cuda":
        return 1
    return max(1, min(triton.cdiv(4 * _num_sms(device.index or 0), programs), max_context // MIN_SPLIT_LEN))


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _check(x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if not x.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "the Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 set before "
            "engine.kernels.triton_attention is first imported (the CPU interpreter)"
        )
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1, "K and V caches must share one layout"
    assert x.shape[-1] in (16, 32, 64, 128, 256), "head_dim must be a power of two from 16 to 256"
