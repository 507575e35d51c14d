"""Batched sampling: one pass for the whole step, whatever mix of greedy and random requests.

Random rows use the exponential-race trick (argmax of p / Exp(1) noise draws from p), so a
per-request seed only has to seed that row's noise."""

from __future__ import annotations

import torch

from engine.kernels import cpu_attention
from engine.sampling_params import SamplingParams


class Sampler:
    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, params: list[SamplingParams], request_ids: list[str]) -> list[int]:
        """logits [B, V] float32 -> one token id per row."""
        greedy = greedy_tokens(logits)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if not random_rows:
            return greedy.tolist()
        rows = torch.tensor(random_rows)
        sub = logits[rows]
        temps = torch.tensor([params[i].temperature for i in random_rows], dtype=sub.dtype)
        sub = sub / temps[:, None]
        top_ks = [params[i].top_k for i in random_rows]
        top_ps = [params[i].top_p for i in random_rows]
        min_ps = [params[i].min_p for i in random_rows]
        if any(k > 0 for k in top_ks) or any(p < 1.0 for p in top_ps) or any(m > 0 for m in min_ps):
            sub = _apply_top_k_top_p(sub, top_ks, top_ps, min_ps)
        probs = torch.softmax(sub, dim=-1)
        noise = torch.empty_like(probs)
        for row, i in enumerate(random_rows):
            seed = params[i].seed
            gen = None
            if seed is not None:
                gen = self._generators.get(request_ids[i])
                if gen is None:
                    gen = self._generators[request_ids[i]] = torch.Generator().manual_seed(seed)
            noise[row].exponential_(generator=gen)
        chosen = (probs / noise).max(dim=-1).indices
        result = greedy.clone()
        result[rows] = chosen
        return result.tolist()


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax: the first of tied maxima, NaN first (torch.max(dim)'s answer). On CPU
    the C++ op where it is built (bf16 read as it is; 7x torch's max(dim) on batch-64 logits
    here), else max(dim).indices, which ran 2.5x faster than argmax's serial CPU kernel."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.bfloat16) and cpu_attention.available():
        return cpu_attention.greedy_pick(logits)
    return logits.max(dim=-1).indices


def _apply_top_k_top_p(
    logits: torch.Tensor, top_ks: list[int], top_ps: list[float], min_ps: list[float]
) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ks = torch.tensor([k if k > 0 else vocab for k in top_ks])
    positions = torch.arange(vocab)[None, :]
    drop = positions >= ks[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= torch.tensor(top_ps, dtype=probs.dtype)[:, None]
    # min_p: drop what is less likely than min_p x the top token (which itself always stays).
    drop |= probs < torch.tensor(min_ps, dtype=probs.dtype)[:, None] * probs[:, :1]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
