"""Speculative decoding's check (engine/sample/spec_decode.py makes the guesses): from the verify pass's
k + 1 rows of logits, which guesses stand, and the token after them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.sample.sampler import pick_from_weights


def accept_greedy(argmax: list[int], drafts: Sequence[int]) -> list[int]:
    """argmax: the model's choice at each of the k + 1 rows (row i follows draft i - 1). The
    drafts it agrees with, in order until the first it does not, then its own token there."""
    out: list[int] = []
    for guess, choice in zip(drafts, argmax):
        if guess != choice:
            out.append(choice)
            return out
        out.append(guess)
    out.append(argmax[len(drafts)])
    return out


def accept_sampled(probs: torch.Tensor, drafts: Sequence[int], uniform: Callable[[], float]) -> list[int]:
    """Rejection sampling for drafts proposed with certainty (an n-gram's guess has q = 1): draft
    i is kept with probability p_i(draft); at the first rejection the token is drawn from p_i with
    the draft taken out, renormalised; all kept, the last row's p draws one more. Each token so
    made is distributed as p, as if sampled one step at a time (Leviathan et al. 2023, with q a
    point mass). probs: [k + 1, V] float64, each row sums to 1."""
    out: list[int] = []
    for i, guess in enumerate(drafts):
        row = probs[i]
        kept = float(row[guess])
        if uniform() < kept:
            out.append(guess)
            continue
        residual = row.clone()
        residual[guess] = 0.0
        out.append(_draw(residual, uniform()))
        return out
    out.append(_draw(probs[len(drafts)], uniform()))
    return out



def _draw(weights: torch.Tensor, u: float) -> int:
    return int(pick_from_weights(weights[None], torch.tensor([u], dtype=torch.float64))[0])
