"""Incremental, UTF-8-safe detokenization for streaming.

Byte-level BPE can split one character over several tokens; decoding a token alone would emit
U+FFFD. We decode a window that starts a little before the new tokens (so merges at the boundary
decode as in the full text) and release text only once it no longer ends mid-character."""

from __future__ import annotations

from engine.model.tokenizer import ChatTokenizer
from engine.sequence import DetokenizerState


def detokenize_step(
    tokenizer: ChatTokenizer, token_ids: list[int], state: DetokenizerState, final: bool = False
) -> str:
    """New text since the last call, for the whole (growing) list of output token_ids. On the
    final call an incomplete character is released too (as U+FFFD), so text matches the ids."""
    prefix_text = tokenizer.decode(token_ids[state.prefix_offset : state.read_offset])
    full_text = tokenizer.decode(token_ids[state.prefix_offset :])
    if (full_text.endswith("\ufffd") and not final) or len(full_text) <= len(prefix_text):
        return ""  # an incomplete character, or a special token that decodes to nothing
    state.prefix_offset = state.read_offset
    state.read_offset = len(token_ids)
    return full_text[len(prefix_text) :]
