"""What changes the logits before sampling: OpenAI's presence/frequency penalties, the
repetition penalty (HF's and vLLM's), and min_tokens (EOS and stop tokens masked until then).

Only rows whose request asks for one of these are touched; the others pass through as they are."""

from __future__ import annotations

import torch

from engine.core.sequence import Sequence, needs_processing


def process_logits(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: list[int]) -> torch.Tensor:
    """logits [B, V] float32, one row per sequence -> a processed copy (or logits itself)."""
    rows = [r for r, seq in enumerate(seqs) if needs_processing(seq)]
    if not rows:
        return logits
    logits = logits.clone()
    vocab = logits.shape[-1]
    for r in rows:
        seq, p = seqs[r], seqs[r].params
        row = logits[r]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long)
            values = row[seen]
            # Divide positive logits, multiply negative ones: both make a seen token less likely.
            row[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and seq.output_token_ids:
            counts = torch.bincount(torch.tensor(seq.output_token_ids), minlength=vocab)[:vocab].to(row.dtype)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
        if len(seq.output_token_ids) < p.min_tokens:
            banned = [t for t in {*p.stop_token_ids, *eos_token_ids} if t < vocab]
            row[banned] = float("-inf")
    return logits
