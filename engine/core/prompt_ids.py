"""A request's prompt ids, checked once on admission (LLMEngine.add_request), and the compact
shapes a what-if prompt keeps: a range, or TokenRuns (ranges and short lists end to end)."""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import overload

import numpy as np

from engine.errors import InvalidParamError


class TokenRuns(Sequence[int]):
    """Token ids as runs laid end to end: a shared system prompt (a range), a conversation's earlier
    turns and answers, a request's own part (a range). A what-if fleet queues thousands of such
    prompts; as lists, 4,000 prompts of 6,000 tokens would be ~1 GB of int objects, as runs they
    are a few hundred bytes each. Equal ids are equal tokens whatever the container: the block
    manager and the router hash tuples of the ids, never the runs themselves."""

    __slots__ = ("_len", "_starts", "parts")

    def __init__(self, parts: Sequence[Sequence[int]]) -> None:
        flat: list[Sequence[int]] = []
        for part in parts:  # a run of runs is flattened: a conversation's history nests no deeper
            if isinstance(part, TokenRuns):
                flat.extend(part.parts)
            elif len(part):
                flat.append(part)
        self.parts: tuple[Sequence[int], ...] = tuple(flat)
        self._starts: list[int] = []
        total = 0
        for part in self.parts:
            self._starts.append(total)
            total += len(part)
        self._len = total

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self.parts)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        """An id, or a slice as a list (the block manager takes one block at a time, a P/D
        hand-off the whole prompt): the parts it spans are found by bisection."""
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step != 1:
                return list(self)[index]
            out: list[int] = []
            k = max(0, bisect_right(self._starts, start) - 1)
            while k < len(self.parts) and self._starts[k] < stop:
                first = self._starts[k]
                out.extend(self.parts[k][max(start - first, 0) : stop - first])
                k += 1
            return out
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("TokenRuns index out of range")
        k = bisect_right(self._starts, index) - 1
        return self.parts[k][index - self._starts[k]]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (TokenRuns, list, tuple, range)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable parts may be lists: no hash, as a list has none

    def __repr__(self) -> str:
        return f"TokenRuns({list(self.parts)!r})"

    def bounds(self) -> tuple[int, int]:
        """(smallest, largest) id, a range by its ends and a list by its ids: no id walked twice."""
        lows, highs = [], []
        for part in self.parts:
            if isinstance(part, range):
                lows.append(min(part[0], part[-1]))
                highs.append(max(part[0], part[-1]))
            else:
                lows.append(min(part))
                highs.append(max(part))
        return min(lows), max(highs)


PromptIds = list[int] | range | TokenRuns  # what an engine keeps of a prompt (a what-if one stays compact)


def checked_prompt_ids(prompt_token_ids: Sequence[int], vocab: int) -> PromptIds:
    """A list's ids copied as plain ints, each checked to be an integer in [0, vocab), all in C:
    packing into 64-bit integers refuses floats, strings and huge numbers (an object with
    __index__, such as a numpy integer, counts as its value), and numpy finds the range. A range
    or TokenRuns (a what-if prompt) is checked by its ends and kept as it is."""
    if isinstance(prompt_token_ids, (range, TokenRuns)):  # a what-if prompt: its bounds are its ends
        ids = prompt_token_ids
        if isinstance(ids, range):
            low, high = (min(ids[0], ids[-1]), max(ids[0], ids[-1])) if len(ids) else (0, 0)
        else:
            low, high = ids.bounds() if len(ids) else (0, 0)
        if low < 0 or high >= vocab:
            raise InvalidParamError("prompt", f"token ids must be integers in [0, {vocab})")
        # As a list, each of a big what-if fleet's thousands of running prompts would be ~40 KB of
        # int objects, and the step loops' few fields a sequence scattered among them (the copy
        # made a 64-GPU run ~9% slower).
        return ids
    try:
        packed = array("q", prompt_token_ids)
    except (TypeError, OverflowError):
        packed = None
    values = np.frombuffer(packed, dtype=np.int64) if packed else None
    if values is None or values.min() < 0 or values.max() >= vocab:
        raise InvalidParamError("prompt", f"token ids must be integers in [0, {vocab})")
    return packed.tolist()
