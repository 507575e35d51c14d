"""Prefill/decode disaggregation's handoff: a prompt's KV blocks leave the replica that prefilled
it and land in the one that decodes it, so the decode replica starts past the prompt.

What moves is the prompt's full blocks, every layer's keys and values, as one tensor
[layers, 2, blocks, block_size, kv_heads, head_dim] in the cache's dtype. On the way it sits in
shared memory (one segment per request, named in the messages that travel between processes,
unlinked by whoever reads it last); the decode side writes it into free blocks and files them as
cached prefix blocks (BlockManager.import_prefix), so its own prefix lookup starts the request's
counter past them, as a prefix-cache hit does. The partial last block and the first output token
are computed again there: fewer than block_size + 1 tokens, the price of moving only full blocks.
Filed as cached, the blocks are free until the request is admitted: a busy decode replica's own
allocations may evict them first (least recently used last), and the request then computes its
prompt again, correct but slower; import them as the request is added.

The simulator moves no bytes: it takes the transfer's time and imports the keys alone
(engine/sim/replica.py)."""

from __future__ import annotations

from multiprocessing import shared_memory
from typing import TYPE_CHECKING

import torch

from engine.core.kv_segment import SharedKV

if TYPE_CHECKING:
    from engine.core.block_manager import BlockManager
    from engine.core.sequence import Sequence

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values) [blocks, block_size, kv_heads, head_dim]


def export_blocks(kv_caches: KVCaches, block_ids: list[int]) -> torch.Tensor:
    """These blocks' keys and values, every layer, as one contiguous tensor on the CPU."""
    index = torch.tensor(block_ids, dtype=torch.long, device=kv_caches[0][0].device)
    out = torch.stack([torch.stack((k.index_select(0, index), v.index_select(0, index))) for k, v in kv_caches])
    return out.cpu().contiguous()


def import_blocks(kv_caches: KVCaches, block_ids: list[int], blocks: torch.Tensor) -> None:
    """Write export_blocks' tensor (its blocks in block_ids' order) into these blocks."""
    index = torch.tensor(block_ids, dtype=torch.long, device=kv_caches[0][0].device)
    blocks = blocks.to(kv_caches[0][0].device)
    for layer, (k, v) in enumerate(kv_caches):
        k.index_copy_(0, index, blocks[layer, 0].to(k.dtype))
        v.index_copy_(0, index, blocks[layer, 1].to(v.dtype))


def export_prompt(kv_caches: KVCaches, seq: Sequence, block_size: int) -> torch.Tensor:
    """seq's full prompt blocks from the cache (before they are freed)."""
    full = len(seq.prompt_token_ids) // block_size
    return export_blocks(kv_caches, seq.block_table[:full])


def import_prompt(kv: BlockManager, kv_caches: KVCaches, token_ids: list[int], blocks: torch.Tensor) -> int:
    """A handed-off prompt's blocks into the cache as cached prefix blocks (those it already
    caches are kept, and at most the free blocks are written). How many were written."""
    placed = kv.import_prefix(token_ids[: blocks.shape[2] * kv.block_size])
    if placed:
        indices = torch.tensor([i for i, _ in placed], dtype=torch.long)
        import_blocks(kv_caches, [block_id for _, block_id in placed], blocks.index_select(2, indices))
    return len(placed)


def caches_of(runner: object) -> KVCaches:
    """A live runner's KV tensors (a what-if runner has none: it moves no bytes)."""
    caches = getattr(runner, "kv_caches", None)
    if caches is None:
        raise RuntimeError("this engine holds no KV tensors to hand off (a what-if replica moves none)")
    return caches


def write_shared(blocks: torch.Tensor) -> SharedKV:
    """A new shared-memory segment holding the blocks; its reader unlinks it (or SharedKV.discard)."""
    blocks = blocks.contiguous()
    raw = blocks.view(torch.uint8).reshape(-1)
    segment = shared_memory.SharedMemory(create=True, size=max(1, raw.numel()))
    try:
        torch.frombuffer(segment.buf, dtype=torch.uint8, count=raw.numel()).copy_(raw)
        return SharedKV(segment.name, tuple(blocks.shape), str(blocks.dtype).removeprefix("torch."))
    finally:
        segment.close()


def read_shared(shared: SharedKV) -> torch.Tensor:
    """The blocks, copied out; the segment is unlinked."""
    segment = shared_memory.SharedMemory(name=shared.name)
    try:
        raw = torch.frombuffer(segment.buf, dtype=torch.uint8, count=shared.nbytes).clone()
        dtype = getattr(torch, shared.dtype)
        return raw.view(dtype).reshape(shared.shape)
    finally:
        segment.close()
        segment.unlink()
