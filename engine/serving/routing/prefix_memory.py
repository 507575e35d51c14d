"""What the router remembers of the prompt blocks it sent to one replica: at most `capacity`
block keys, the least recently sent forgotten first (prefix-aware routing's guess of what the
replica caches).

A block's key stands for it and every block before it (prefix_keys), so two prompts share a key
only if they share every block up to it, their first above all. That allows two ways to keep
the same memory:

- *By prompt*, while no prompt sent shares a first block with one still remembered (distinct
  prompts, as a what-if fleet's mostly are): a log of the prompts, the oldest one's first keys cut
  as they are forgotten, and an index of their first keys. A send is an index lookup and an append;
  no key but the first is hashed until it is asked for. A what-if fleet sends a 1,000-token
  prompt 300 times a second: keeping its 62 keys each cost a fifth of the run.
- *By key*, from the first prompt that may share (its first key is in the index): every key's
  latest place in a log of sends; forgetting walks the log from its oldest end, skipping entries
  whose key was sent again later. The memory turns to this once and stays.

Both answer as one least-recently-used set of keys would (tests/test_router_prefix_memory.py
compares them with an OrderedDict)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from itertools import chain


def prefix_keys(token_ids: Sequence[int], block_size: int) -> list[int]:
    """One key per full block of the prompt that stands for it and every token before it: Python's
    own tuple hash, chained. The router only guesses which replica caches a prefix, so a 64-bit
    hash is enough here (5x cheaper than the block manager's blake2b, which must never collide)."""
    parent, keys = 0, []
    append = keys.append
    # Full blocks as tuples straight from one iterator (a simulated prompt is a range): no list of
    # the prompt's ids, no slicing; a trailing partial block is left out, as zip leaves it.
    for block in zip(*[iter(token_ids)] * block_size):
        parent = hash((parent, block))
        append(parent)
    return keys


class PromptBlocks:
    """A prompt's block keys, hashed when first asked for: its first key at once (one block),
    the rest (all_keys()) only where they decide something."""

    __slots__ = ("_keys", "block_size", "first", "ids")

    def __init__(self, ids: Sequence[int], block_size: int) -> None:
        self.ids, self.block_size = ids, block_size
        self.first: int | None = hash((0, tuple(ids[:block_size]))) if len(ids) >= block_size else None
        self._keys: list[int] | None = None

    def __len__(self) -> int:
        return len(self.ids) // self.block_size

    def all_keys(self) -> list[int]:
        if self._keys is None:
            self._keys = prefix_keys(self.ids, self.block_size)
        return self._keys


class PrefixMemory:
    __slots__ = ("_base", "_by_first", "_cut", "_head", "_last", "_log", "_prompts", "_size", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # By prompt (while _last is None): the prompts oldest first, the oldest's first _cut keys
        # forgotten, _size keys in all, and each prompt by its first key.
        self._prompts: deque[PromptBlocks] = deque()
        self._by_first: dict[int, PromptBlocks] = {}
        self._cut = self._size = 0
        # By key: key -> its latest position in _log; _log[i] is position _base + i, and the
        # entries before _head are forgotten.
        self._last: dict[int, int] | None = None
        self._log: list[int] = []
        self._base = self._head = 0

    def __len__(self) -> int:
        return self._size if self._last is None else len(self._last)

    def __iter__(self) -> Iterator[int]:
        """The remembered keys, least recently sent first."""
        if self._last is None:
            return chain.from_iterable(
                p.all_keys()[self._cut :] if i == 0 else p.all_keys() for i, p in enumerate(self._prompts)
            )
        last, base = self._last, self._base
        return (key for i, key in enumerate(self._log[self._head :], base + self._head) if last[key] == i)

    def leading(self, blocks: PromptBlocks) -> int:
        """How many of a prompt's blocks, from its first, are remembered (its cached head, as guessed)."""
        if blocks.first is None:
            return 0
        if self._last is None:
            sent = self._by_first.get(blocks.first)
            if sent is None or (self._cut and sent is self._prompts[0]):  # never sent, or its head forgotten
                return 0
            n = 0  # only `sent` can hold this prompt's keys: they are the same blocks from the first on
            for mine, theirs in zip(blocks.all_keys(), sent.all_keys()):
                if mine != theirs:
                    break
                n += 1
            return n
        last, n = self._last, 0
        for key in blocks.all_keys():
            if key not in last:
                break
            n += 1
        return n

    def remember(self, blocks: PromptBlocks) -> None:
        """A prompt's blocks, in prompt order, become the most recently sent; the oldest past
        capacity are forgotten."""
        if blocks.first is None:
            return
        if self._last is None:
            if blocks.first not in self._by_first:
                self._remember_prompt(blocks)
                return
            self._to_keys()  # it may share blocks with a remembered prompt
        self._remember_keys(blocks.all_keys())

    def _remember_prompt(self, blocks: PromptBlocks) -> None:
        prompts = self._prompts
        prompts.append(blocks)
        self._by_first[blocks.first] = blocks  # type: ignore[index]  # remember() checked it
        self._size += len(blocks)
        while self._size > self.capacity:
            oldest = prompts[0]
            drop = min(self._size - self.capacity, len(oldest) - self._cut)
            self._cut += drop
            self._size -= drop
            if self._cut == len(oldest):
                prompts.popleft()
                del self._by_first[oldest.first]  # type: ignore[arg-type]
                self._cut = 0

    def _to_keys(self) -> None:
        """From prompts to keys, the same keys in the same order."""
        keys = list(self)
        self._last, self._base = {}, 0
        self._prompts.clear()
        self._by_first.clear()
        self._rewrite_log(keys)

    def _rewrite_log(self, keys: list[int]) -> None:
        """The log becomes the remembered keys alone, oldest first, at positions after every one
        used before (so no stale position can match)."""
        assert self._last is not None
        self._base += len(self._log)
        self._log, self._head = keys, 0
        self._last.update(zip(keys, range(self._base, self._base + len(keys))))

    def _remember_keys(self, keys: list[int]) -> None:
        log, last = self._log, self._last
        assert last is not None
        end = self._base + len(log)
        log.extend(keys)
        last.update(zip(keys, range(end, end + len(keys))))
        head = self._head
        if (excess := len(last) - self.capacity) > 0:
            if len(log) - head == len(last):  # no stale entry: the oldest keys are the first
                deque(map(last.__delitem__, log[head : head + excess]), 0)
                head += excess
            else:
                position = self._base + head
                while excess:
                    key = log[head]
                    if last[key] == position:
                        del last[key]
                        excess -= 1
                    head += 1
                    position += 1
        if head > 1024 and 2 * head > len(log):  # drop the forgotten entries, a slice at a time
            del log[:head]
            self._base += head
            head = 0
        self._head = head
        if len(log) - head > 2 * len(last) + 1024:  # mostly stale (one prompt sent over and over)
            self._rewrite_log(list(self))
