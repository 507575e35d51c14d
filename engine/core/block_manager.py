"""The block manager owns the paged KV cache's blocks: who holds which, and which full blocks
can be reused by a later request with the same prefix.

Free blocks sit in two places. Blocks that hold nothing reusable are a stack (`empty`), handed
out first. A freed block that holds a cached prefix keeps its hash in an LRU queue
(`free_cached`) until it is handed out again, so "evict the least recently used cached block" is
simply "take the front of that queue" once no empty block is left.

A block's state is one entry in each of three lists (ref_counts, hashes, tokens), not an object
per block: a 70B replica on 8 H100s has 195,000 blocks, and as objects they cost seconds to
build and every full garbage collection walks them all.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from itertools import repeat
from operator import attrgetter
from typing import cast

from engine.core.sequence import Sequence

_table_of = attrgetter("block_table")


def chain_hash(parent: bytes, token_ids: tuple[int, ...]) -> bytes:
    """A block's hash covers its tokens and, through its parent, every token before it."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array("q", token_ids).tobytes())  # 8 bytes an id, no text: 2x faster than joining
    return digest.digest()


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockReader:
    """One sequence's blocks as tuples, block i = tokens [i x bs, (i + 1) x bs). The first few are
    read alone (a decode step's one new block of a 6,000-token prompt copies 16 tokens, not
    6,000); past them, one list of its tokens is sliced (a prompt's hundreds of blocks at C speed,
    where a what-if prompt's runs would be walked block by block)."""

    __slots__ = ("_reads", "_tokens", "bs", "seq")
    FEW = 4

    def __init__(self, seq: Sequence, bs: int) -> None:
        self.seq, self.bs = seq, bs
        self._tokens: list[int] | None = None
        self._reads = 0

    def __call__(self, i: int) -> tuple[int, ...]:
        bs = self.bs
        if self._tokens is None:
            self._reads += 1
            if self._reads <= self.FEW:
                return self.seq.block_tokens(i * bs, (i + 1) * bs)
            self._tokens = self.seq.token_ids
        return tuple(self._tokens[i * bs : (i + 1) * bs])


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self._refs = [0] * num_blocks  # sequences holding each block, once not plain (ref_counts)
        self.hashes: list[bytes | None] = [None] * num_blocks  # the prefix a block caches, if any
        self.tokens: list[tuple[int, ...]] = [()] * num_blocks  # its tokens, to rule out collisions
        self.empty = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.cached: dict[bytes, int] = {}
        self.prefix_queries = 0  # tokens looked up at admission
        self.prefix_hits = 0  # tokens found in the cache
        # No block was ever published, imported or shared: each held block has one holder and no
        # hash, so the holders need no count (a block is held exactly when it is not free) and
        # blocks come and go as slices of the empty stack. A what-if replica without prefix
        # caching stays plain; its ref counts, a random write a block into 195,000, were a tenth
        # of a big run. Prefix caching is a live lever, so this is what happened, not the setting.
        self.plain = True

    @property
    def ref_counts(self) -> list[int]:
        """How many sequences hold each block (plain: 1 for every block not free, derived)."""
        return self._derived_refs() if self.plain else self._refs

    def _derived_refs(self) -> list[int]:
        refs = [1] * self.num_blocks
        for block_id in (*self.empty, *self.free_cached):
            refs[block_id] = 0
        return refs

    def _leave_plain(self) -> None:
        """A block is about to be published, imported or shared: from now on holders are counted."""
        if self.plain:
            self._refs, self.plain = self._derived_refs(), False

    @property
    def num_free_blocks(self) -> int:
        return len(self.empty) + len(self.free_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.empty) - len(self.free_cached)

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Blocks holding the longest cached prefix of seq; at least one token is left to compute,
        since the last prompt position must run to produce the first output token. A request
        that wants prompt logprobs takes no hit: every prompt position has to run for them."""
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return []
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        self._hash_full_blocks(seq, max_blocks)
        looked = list(map(self.cached.get, seq.block_hashes[:max_blocks]))
        found = cast("list[int]", looked[: looked.index(None)] if None in looked else looked)  # up to a miss
        # Blocks compared with this sequence's tokens before still cache the same hash (eviction
        # unmaps a hash), so the same tokens: a waiting request looked up every step skips them.
        known, same = seq.verified_blocks, 0
        if known:
            same = min(len(known), len(found))
            if tuple(found[:same]) != known[:same]:
                same = next(i for i in range(same) if found[i] != known[i])
        block = BlockReader(seq, bs)
        for i in range(same, len(found)):
            if self.tokens[found[i]] != block(i):
                del found[i:]  # a hash collision: never reuse blocks whose tokens differ
                break
        seq.verified_blocks = tuple(found)
        return found

    def can_admit(self, prefix: list[int], num_new_tokens: int) -> bool:
        revived = self.num_revived(prefix)
        need = blocks_for(len(prefix) * self.block_size + num_new_tokens, self.block_size) - len(prefix)
        return need + revived <= self.num_free_blocks

    def num_revived(self, prefix: list[int]) -> int:
        """Blocks of a cached prefix that sit in the free queue: attaching them takes free blocks."""
        if not prefix:
            return 0
        self._leave_plain()
        return sum(1 for b in prefix if self._refs[b] == 0)

    def admit(self, seq: Sequence, prefix: list[int]) -> None:
        """Attach the cached prefix to a sequence that holds no blocks yet."""
        assert not seq.block_table
        if prefix:
            self._leave_plain()
        for block_id in prefix:
            if self._refs[block_id] == 0:
                del self.free_cached[block_id]
            self._refs[block_id] += 1
        seq.block_table = list(prefix)
        seq.num_computed_tokens = len(prefix) * self.block_size
        if seq.num_cached_tokens == 0:
            seq.num_cached_tokens = seq.num_computed_tokens
        if self.enable_prefix_caching:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += seq.num_computed_tokens

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow seq's block table to hold num_new_tokens more; False (and no change) if full."""
        table = seq.block_table
        need = blocks_for(seq.num_computed_tokens + num_new_tokens, self.block_size) - len(table)
        if need <= 0:  # most decode steps: the last block still has room
            return True
        if need > self.num_free_blocks:
            return False
        table += self._take_free_blocks(need)
        return True

    def add_blocks(self, seqs: list[Sequence]) -> None:
        """One more block each for seqs (steady decodes whose last block filled; the caller checked
        room), the ones that many _take_free_blocks(1) calls would give, in C-level passes."""
        empty, k = self.empty, len(seqs)
        if k > len(empty):  # some from the cached free blocks: one at a time
            for seq in seqs:
                seq.block_table += self._take_free_blocks(1)
            return
        taken = empty[len(empty) - k :]
        del empty[len(empty) - k :]
        taken.reverse()
        if not self.plain:
            deque(map(self._refs.__setitem__, taken, repeat(1)), 0)
        deque(map(list.append, map(_table_of, seqs), taken), 0)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Publish every block that seq's computed tokens now fill, for later prefix hits."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_published_blocks:
            return
        self._hash_full_blocks(seq, num_full)
        block = BlockReader(seq, self.block_size)
        for i in range(seq.num_published_blocks, num_full):
            block_id, block_hash = seq.block_table[i], seq.block_hashes[i]
            if self.hashes[block_id] is None and block_hash not in self.cached:
                self._leave_plain()
                self.hashes[block_id] = block_hash
                self.tokens[block_id] = block(i)
                self.cached[block_hash] = block_id
        seq.num_published_blocks = num_full

    def import_prefix(self, token_ids: list[int]) -> list[tuple[int, int]]:
        """KV computed elsewhere (a disaggregated prefill replica) lands here as cached prefix
        blocks: free, most recently used, so the scheduler's own prefix lookup starts the
        sequence's counter past them, as a prefix-cache hit does. Blocks already cached are kept;
        it stops where the free blocks run out (a block past a missing one could never be found;
        evicting one just imported would break the chain at its head).
        Returns (the block's index in the prompt, the block it was written to) for each written:
        the caller copies the keys and values there (engine/core/kv_handoff.py)."""
        bs, parent, placed = self.block_size, b"", []
        room = self.num_free_blocks  # an imported block is free (cached) too: never evict one for the next
        for i in range(len(token_ids) // bs):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            parent = chain_hash(parent, chunk)
            if parent in self.cached:
                continue
            if len(placed) == room:
                break
            self._leave_plain()
            block_id = self._take_free_block()
            self._refs[block_id], self.hashes[block_id], self.tokens[block_id] = 0, parent, chunk
            self.cached[parent] = block_id
            self.free_cached[block_id] = None
            placed.append((i, block_id))
        return placed

    def free(self, seq: Sequence) -> None:
        # Tail blocks are released first so they are evicted before the shared head.
        table, empty = seq.block_table, self.empty
        seq.block_table = []
        seq.num_published_blocks = 0
        if self.plain:  # every block held by seq alone, none cached: the empty stack takes them
            empty.extend(reversed(table))
            return
        refs, hashes = self._refs, self.hashes
        # Blocks held by seq alone and holding no cached prefix: all go to the empty stack, tail
        # first, in C-level passes (a what-if run frees a thousand a step).
        if table and not any(map(hashes.__getitem__, table)) and set(map(refs.__getitem__, table)) == {1}:
            deque(map(refs.__setitem__, table, repeat(0)), 0)
            empty.extend(reversed(table))
            return
        for block_id in reversed(table):
            refs[block_id] -= 1
            assert refs[block_id] >= 0, f"block {block_id} freed twice"
            if refs[block_id] == 0:
                if hashes[block_id] is None:
                    empty.append(block_id)  # holds nothing reusable: handed out next
                else:
                    self.free_cached[block_id] = None

    def _take_free_blocks(self, n: int) -> list[int]:
        """n free blocks, in the order n calls of _take_free_block would give them: the empty
        stack's top in one slice (a prompt's dozens of blocks), then the least recently used."""
        empty = self.empty
        k = min(n, len(empty))
        taken = empty[len(empty) - k :]
        del empty[len(empty) - k :]
        taken.reverse()
        if not self.plain:
            deque(map(self._refs.__setitem__, taken, repeat(1)), 0)
        for _ in range(n - k):
            taken.append(self._take_free_block())
        return taken

    def _take_free_block(self) -> int:
        if self.empty:
            block_id = self.empty.pop()
            if not self.plain:
                self._refs[block_id] = 1
            return block_id
        block_id, _ = self.free_cached.popitem(last=False)  # never plain: only cached blocks wait here
        block_hash = self.hashes[block_id]
        if block_hash is not None:  # evict the cached prefix this block held
            if self.cached.get(block_hash) == block_id:
                del self.cached[block_hash]
            self.hashes[block_id] = None
            self.tokens[block_id] = ()
        self._refs[block_id] = 1
        return block_id

    def _hash_full_blocks(self, seq: Sequence, num_blocks: int) -> None:
        if len(seq.block_hashes) >= num_blocks:
            return
        block = BlockReader(seq, self.block_size)
        for i in range(len(seq.block_hashes), num_blocks):
            parent = seq.block_hashes[-1] if seq.block_hashes else b""
            seq.block_hashes.append(chain_hash(parent, block(i)))
