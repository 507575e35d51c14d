"""Incremental, UTF-8-safe detokenization for streaming.

Byte-level BPE can split one character over several tokens; decoding a token alone would emit
U+FFFD. We decode a window that starts a little before the new tokens (so merges at the boundary
decode as in the full text) and release text only once it no longer ends mid-character."""

from __future__ import annotations

from engine.core.sequence import DetokenizerState, FinishReason, Sequence
from engine.model.tokenizer import ChatTokenizer


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


def text_step(
    tokenizer: ChatTokenizer | None, seq: Sequence, reason: FinishReason | None
) -> tuple[FinishReason | None, str]:
    """Detokenize the new tokens and look for stop strings; the text that is safe to hand out."""
    params = seq.params
    if tokenizer is not None:
        seq.output_text += detokenize_step(tokenizer, seq.output_token_ids, seq.detok, final=reason is not None)
    if params.stop and (cut := _find_stop(seq.output_text, params.stop)) is not None:
        seq.output_text = seq.output_text[:cut]
        reason = FinishReason.STOP
    # Hold back text that could be the start of a stop string, until it is known not to be.
    hold = 0 if reason or not params.stop else max(len(s) - 1 for s in params.stop)
    end = max(seq.num_text_emitted, len(seq.output_text) - hold)
    new_text = seq.output_text[seq.num_text_emitted : end]
    seq.num_text_emitted = end
    return reason, new_text


def _find_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
