"""The two admission rules that hold blocks back (EngineConfig.admission "reserve", and
EngineConfig.kv_watermark), as the scheduler's _admit asks them."""

from __future__ import annotations

from engine.core.block_manager import BlockManager, blocks_for
from engine.core.sequence import Sequence


def growth(seq: Sequence, block_size: int) -> int:
    """Blocks seq may still take before it reaches prompt + max_tokens."""
    return blocks_for(seq.max_total_tokens, block_size) - len(seq.block_table)


def unpromised_blocks(kv: BlockManager, running: list[Sequence]) -> int:
    """reserve (TensorRT-LLM's guaranteed-no-evict): free blocks less what every running sequence
    may still grow into."""
    return kv.num_free_blocks - sum(growth(s, kv.block_size) for s in running)


def leaves_watermark(kv: BlockManager, seq: Sequence, prefix: list[int], owed_blocks: int, keep_free: int) -> bool:
    """vLLM v0's can_allocate: the waiter's whole uncached prompt (and any cached blocks it takes
    out of the free queue), less what earlier admissions still owe, leaves keep_free blocks free.
    vLLM allocated a prompt's blocks whole at admission; here they are taken chunk by chunk, so
    the blocks still owed to prompts part-way through their prefill count as taken."""
    need = blocks_for(seq.num_tokens, kv.block_size) - len(prefix) + kv.num_revived(prefix)
    return kv.num_free_blocks - owed_blocks - need >= keep_free


def owed(seq: Sequence, block_size: int) -> int:
    """Blocks a running sequence still needs to finish its prompt (a recompute: prompt + outputs)."""
    if seq.num_tokens - seq.num_computed_tokens <= 1:  # decoding: its growth is the watermark's job
        return 0
    return max(0, blocks_for(seq.num_tokens, block_size) - len(seq.block_table))
