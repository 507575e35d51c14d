"""A request's prompt token ids, checked once on admission (LLMEngine.add_request)."""

from __future__ import annotations

from array import array

import numpy as np

from engine.errors import InvalidParamError


def checked_prompt_ids(prompt_token_ids: list[int] | range, vocab: int) -> list[int] | range:
    """A list's ids copied as plain ints, each checked to be an integer in [0, vocab), all in C:
    packing into 64-bit integers refuses floats, strings and huge numbers (an object with
    __index__, such as a numpy integer, counts as its value), and numpy finds the range. A range
    (a what-if prompt) is checked by its ends and kept as it is."""
    if isinstance(prompt_token_ids, range):  # a what-if prompt: its bounds are its ends
        ids = prompt_token_ids
        if len(ids) and (min(ids[0], ids[-1]) < 0 or max(ids[0], ids[-1]) >= vocab):
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
