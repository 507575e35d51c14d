"""Speculative decoding with n-gram prompt lookup (vLLM's `ngram` method): guess a decode's next
tokens by finding where its last few tokens appeared before in its own prompt and output, then
check the guesses in one forward pass.

A decode step reads every weight to make one token; a verify step reads them once for the token
and k guesses, at about the same cost while the batch is small (memory-bound). Every guess the
model agrees with is a token for free; the first it disagrees with is replaced by the model's own
token, so a step always makes at least one. Text that quotes its prompt (editing, summarising,
code) repeats long runs, and the guesses come true.

The three parts: propose() (after a step, Speculation.guess, the engine's), the scheduler gives a
guessing decode 1 + k tokens of the budget, and engine/sample/spec_verify.py (the runner's, on the verify
pass's k + 1 rows of logits). A rejected guess's KV needs no undo: the sequence's computed-token
counter stops before it, and the next step writes that slot again.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from collections.abc import Sequence as Ids
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.core.sequence import FinishReason, Sequence, needs_processing, stop_reason


def propose(token_ids: Ids[int], k: int, lookup_min: int, lookup_max: int) -> list[int]:
    """Up to k tokens that followed the earliest earlier occurrence of the longest suffix of
    token_ids (lookup_max tokens down to lookup_min) found before its end; [] if none is.
    vLLM's NgramProposer makes the same choice (longest n first, then the earliest match)."""
    total = len(token_ids)
    if k <= 0 or total <= lookup_min:
        return []
    ids = array("i", token_ids)  # a C search over bytes: 4 per id, matches only at id boundaries
    raw = ids.tobytes()
    limit = 4 * (total - 1)  # a match ends before the last id: a token follows it
    for n in range(min(lookup_max, total - 1), lookup_min - 1, -1):
        suffix = raw[-4 * n :]
        at = raw.find(suffix, 0, limit)
        while at >= 0 and at % 4:
            at = raw.find(suffix, at + 1, limit)
        if at >= 0:
            start = at // 4 + n
            return ids[start : start + k].tolist()
    return []


# What makes a decode's guesses: (the sequence, how many at most, lookup_min, lookup_max) -> its
# guesses. The live engine looks them up in the text (ngram); a what-if replica guesses blindly
# and its cost model draws how many stand (engine/sim/runner.py).
Proposer = Callable[[Sequence, int, int, int], list[int]]


def ngram(seq: Sequence, k: int, lookup_min: int, lookup_max: int) -> list[int]:
    return propose(seq.token_ids, k, lookup_min, lookup_max)


@dataclass
class Speculation:
    """An engine's guessing: made after each step for the running decodes, and counted as the
    verify passes check them (vLLM's spec_decode_num_drafts, _draft_tokens, _accepted_tokens)."""

    checks: int = 0  # verify passes: one per speculating decode per step
    proposed: int = 0  # guesses checked
    accepted: int = 0  # guesses the model agreed with
    proposer: Proposer = field(default=ngram)

    def guess(self, running: list[Sequence], config: EngineConfig, max_model_len: int) -> None:
        """Each running decode that may speculate gets its guesses for the next step: as many as
        it may still output past the next token, within the context."""
        k, lo, hi = config.num_speculative_tokens, config.spec_lookup_min, config.spec_lookup_max
        proposer = self.proposer
        for seq in running:
            if seq.num_computed_tokens != seq.num_tokens - 1 or not may_speculate(seq):
                continue
            room = min(k, seq.max_output - len(seq.output_token_ids) - 1, max_model_len - seq.num_tokens)
            seq.spec_token_ids = tuple(proposer(seq, room, lo, hi)) if room > 0 else ()

    def land(self, seq: Sequence, tokens: list[int], now: float) -> FinishReason | None:
        """A verify pass's tokens (the accepted guesses, then the model's own) join seq's output,
        up to the first that ends it; its counter then covers its last token and the guesses kept.
        The reason it ended, if it did."""
        self.checks += 1
        self.proposed += len(seq.spec_token_ids)
        self.accepted += len(tokens) - 1
        seq.spec_token_ids = ()
        output_ids, times, reason, kept = seq.output_token_ids, seq.times, None, 0
        for token in tokens:
            kept += 1
            output_ids.append(token)
            times.tokens.append(now)
            if reason := stop_reason(seq, token):
                break
        seq.num_computed_tokens += kept
        return reason


def may_speculate(seq: Sequence) -> bool:
    """Guessing is left out where a token's logits must be processed or reported one at a time
    (penalties, min_tokens' EOS mask, logprobs)."""
    params = seq.params
    return params.logprobs is None and params.prompt_logprobs is None and not needs_processing(seq)
