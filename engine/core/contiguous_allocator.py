"""KV layout for `paged=false`: each sequence reserves one contiguous slab big enough for its
prompt plus max_tokens, up front, the way servers did before paging. The slab is made of the
same cache blocks (so the same attention code runs), but the reservation is what the lesson
measures: most of a slab holds no token for most of its life, and free memory fragments."""

from __future__ import annotations

from engine.core.block_manager import blocks_for
from engine.core.sequence import Sequence


class ContiguousAllocator:
    enable_prefix_caching = False
    prefix_queries = 0
    prefix_hits = 0

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.used = [False] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.used.count(False)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Reserve seq's whole slab at its first call; False (and no change) if no run is free."""
        if seq.block_table:  # the slab was sized for the whole request at its first step
            return True
        need = blocks_for(seq.max_total_tokens, self.block_size)
        start = self._find_run(need)
        if start is None:
            return False
        for i in range(start, start + need):
            self.used[i] = True
        seq.block_table = list(range(start, start + need))
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        pass

    def free(self, seq: Sequence) -> None:
        for i in seq.block_table:
            self.used[i] = False
        seq.block_table = []

    def _find_run(self, length: int) -> int | None:
        run = 0
        for i, used in enumerate(self.used):
            run = 0 if used else run + 1
            if run == length:
                return i - length + 1
        return None
