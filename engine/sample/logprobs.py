"""Log probabilities from the logits the sampler sees (no second forward pass).

They are the model's own distribution: log_softmax of the raw logits in float32, before
temperature, penalties or top-k/top-p (vLLM's default, "raw_logprobs"), so they do not depend on
how a request samples."""

from __future__ import annotations

import torch

from engine.core.sequence import TokenLogprobs


def token_logprobs(logits: torch.Tensor, token_ids: list[int], ks: list[int]) -> list[TokenLogprobs]:
    """logits [R, V] (any float dtype) -> row r's logprob of token_ids[r] and its ks[r] best."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor(token_ids, device=logprobs.device)[:, None])[:, 0].tolist()
    k_max = max(ks, default=0)
    if k_max:
        values, indices = logprobs.topk(k_max, dim=-1)
        values, indices = values.tolist(), indices.tolist()
    out = []
    for r, (token, k) in enumerate(zip(token_ids, ks)):
        top = list(zip(indices[r][:k], values[r][:k])) if k else []
        out.append(TokenLogprobs(token, chosen[r], top))
    return out
