"""A handed-off prompt's KV blocks in a shared-memory segment (engine/core/kv_handoff.py writes and
reads it): what crosses between processes is this record, a name and a shape, not the bytes. No
torch here: the front process, which relays it and frees it when its request fails on the way,
stays torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing import shared_memory

ITEM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}  # the KV cache's dtypes


@dataclass(frozen=True)
class SharedKV:
    name: str  # the segment's
    shape: tuple[int, ...]  # [layers, 2, blocks, block_size, kv_heads, head_dim]
    dtype: str  # torch's name, a key of ITEM_BYTES

    @property
    def num_blocks(self) -> int:
        return self.shape[2]

    @property
    def nbytes(self) -> int:
        n = ITEM_BYTES[self.dtype]
        for size in self.shape:
            n *= size
        return n

    def discard(self) -> None:
        """Free the segment unread (its request failed or was cancelled on the way); harmless if
        it is already gone."""
        try:
            segment = shared_memory.SharedMemory(name=self.name)
        except FileNotFoundError:
            return
        segment.close()
        try:
            segment.unlink()
        except FileNotFoundError:  # its reader unlinked it between the two calls
            pass
