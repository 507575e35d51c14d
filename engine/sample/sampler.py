"""Batched sampling: one pass for the whole step, whatever mix of greedy and random requests.

A random row is one uniform draw u pushed through the inverse of its CDF: the first token whose
running probability passes u. One number per row lets a seeded request own its randomness
whatever shares its batch. On CPU the C++ pick does it with one exp per logit (0.8 ms at batch 64);
the exponential race it replaced (argmax of p / Exp(1) noise, 3 million draws from torch's serial
CPU generator) took 65 ms (bench/sampler_bench.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.kernels import cpu_attention
from engine.sampling_params import SamplingParams


class Sampler:
    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, params: list[SamplingParams], request_ids: list[str]) -> list[int]:
        """logits [B, V] (float32, or the model's bfloat16 when nothing processed them) -> one
        token id per row."""
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if len(random_rows) < len(params):
            result = greedy_tokens(logits)
            if not random_rows:
                return result.tolist()
        else:
            result = torch.empty(len(params), dtype=torch.long)
        sub = logits if len(random_rows) == len(params) else logits[torch.tensor(random_rows, device=logits.device)]
        temps = torch.tensor([params[i].temperature for i in random_rows], dtype=torch.float32, device=logits.device)
        top_ks = [params[i].top_k for i in random_rows]
        top_ps = [params[i].top_p for i in random_rows]
        min_ps = [params[i].min_p for i in random_rows]
        uniforms = self._uniforms([params[i] for i in random_rows], [request_ids[i] for i in random_rows])
        uniforms = uniforms.to(logits.device)
        chosen = draw(sub, 1.0 / temps, uniforms)  # 1 ms for 64 rows: the filtered ones redraw below
        filtered = [j for j, (k, p, m) in enumerate(zip(top_ks, top_ps, min_ps)) if k > 0 or p < 1.0 or m > 0]
        if filtered:
            f = torch.tensor(filtered, device=logits.device)
            chosen[f] = _filtered_draw(
                sub[f].float() / temps[f, None],
                [top_ks[j] for j in filtered],
                [top_ps[j] for j in filtered],
                [min_ps[j] for j in filtered],
                uniforms[f],
            )
        result[torch.tensor(random_rows)] = chosen.to(result.device)
        return result.tolist()

    def uniform_source(self, params: SamplingParams, request_id: str) -> Callable[[], float]:
        """Uniform draws in [0, 1) for one request, one at a time (speculative decoding's accept
        tests): from its own generator when it is seeded, as sample() draws for it."""
        gen = self._generator(params, request_id)
        return lambda: float(torch.rand((), dtype=torch.float64, generator=gen))

    def _generator(self, params: SamplingParams, request_id: str) -> torch.Generator | None:
        """A seeded request's own generator, made at its first draw; None (torch's global one) for
        the others."""
        if params.seed is None:
            return None
        gen = self._generators.get(request_id)
        if gen is None:
            gen = self._generators[request_id] = torch.Generator().manual_seed(params.seed)
        return gen

    def _uniforms(self, params: list[SamplingParams], request_ids: list[str]) -> torch.Tensor:
        """One float64 in [0, 1) per row: a seeded request's from its own generator, the others'
        from torch's global one."""
        uniforms = torch.rand(len(params), dtype=torch.float64)
        for row, (p, request_id) in enumerate(zip(params, request_ids)):
            gen = self._generator(p, request_id)
            if gen is not None:
                uniforms[row] = torch.rand((), dtype=torch.float64, generator=gen)
        return uniforms


def draw(logits: torch.Tensor, inv_temps: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Row b's token from softmax(logits[b] * inv_temps[b]) at the inverse CDF of uniforms[b]:
    the C++ pick on CPU where it is built, else torch (the same rule: the first token whose
    running probability passes u)."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.bfloat16) and cpu_attention.available():
        return cpu_attention.sample_pick(logits, inv_temps, uniforms)
    return draw_torch(logits, inv_temps, uniforms)


def draw_torch(logits: torch.Tensor, inv_temps: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """draw() in torch, on any device (float64 CDF)."""
    return pick_from_weights(torch.softmax(logits.double() * inv_temps.double()[:, None], dim=-1), uniforms)


def pick_from_weights(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Row b's first token whose running weight passes uniforms[b] of the row's total: the
    inverse CDF, for weights that need not sum to one (float64)."""
    cdf = weights.cumsum(dim=-1)
    target = (uniforms.to(cdf.dtype) * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp(max=weights.shape[-1] - 1)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax: the first of tied maxima, NaN first (torch.max(dim)'s answer). On CPU
    the C++ op where it is built (bf16 read as it is; 7x torch's max(dim) on batch-64 logits
    here), else max(dim).indices, which ran 2.5x faster than argmax's serial CPU kernel."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.bfloat16) and cpu_attention.available():
        return cpu_attention.greedy_pick(logits)
    return logits.max(dim=-1).indices


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """One request's rows [n, V] -> float64 probabilities as sample() would draw from them: the
    temperature, then top-k, top-p and min_p (filter_rows over the whole sorted row)."""
    scaled = logits.double() / params.temperature
    if params.top_k <= 0 and params.top_p >= 1.0 and params.min_p <= 0:
        return torch.softmax(scaled, dim=-1)
    rows, vocab = scaled.shape
    ks = torch.full((rows,), params.top_k if 0 < params.top_k < vocab else vocab)
    ps = torch.full((rows,), params.top_p, dtype=scaled.dtype)
    mins = torch.full((rows,), params.min_p, dtype=scaled.dtype)
    kept, ids, _ = filter_rows(scaled, ks, ps, mins, torch.logsumexp(scaled, dim=-1), vocab)
    return torch.zeros_like(scaled).scatter_(1, ids, torch.softmax(kept, dim=-1))


# Candidates per row before a full sort: torch's CPU sort of 64 x 49,152 logits took 89 ms here,
# topk(1024) 12 ms, and 94% of SmolLM2's rows at temperature 1 hold 0.9 of their mass in their
# top 1,024 tokens; the other rows are sorted whole.
CANDIDATES = 1024


def _filtered_draw(
    logits: torch.Tensor, top_ks: list[int], top_ps: list[float], min_ps: list[float], uniforms: torch.Tensor
) -> torch.Tensor:
    """Each row's token from what top-k, top-p and min_p keep of it (see filter_rows), drawn at
    its uniform: from the row's largest logits where they hold everything kept, else from the
    whole sorted row."""
    vocab = logits.shape[-1]
    dev = logits.device
    ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_ks], device=dev)
    ps = torch.tensor(top_ps, dtype=logits.dtype, device=dev)
    mins = torch.tensor(min_ps, dtype=logits.dtype, device=dev)
    full_lse = torch.logsumexp(logits, dim=-1)
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=dev)
    rows = torch.arange(logits.shape[0], device=dev)
    width = min(vocab, max(CANDIDATES, int(ks[ks < vocab].max()) if bool((ks < vocab).any()) else 0))
    while len(rows):
        kept, ids, covered = filter_rows(logits[rows], ks[rows], ps[rows], mins[rows], full_lse[rows], width)
        done = covered | (width == vocab)
        picked = draw(kept[done], torch.ones(int(done.sum()), device=dev), uniforms[rows[done]])
        tokens[rows[done]] = ids[done].gather(1, picked[:, None])[:, 0]
        rows, width = rows[~done], vocab
    return tokens


def filter_rows(
    logits: torch.Tensor,
    ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    full_lse: torch.Tensor,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's order over each row's `width` largest logits: top-k, then top-p over what top-k kept
    (renormalised), then min_p against the top token; the top token always stays. Returns (the
    candidates' logits, -inf where filtered, [B, width]; their token ids; whether the row's kept
    set surely ends inside its candidates). full_lse: each row's logsumexp, top-p's normaliser
    where no top-k applies (ks = vocab)."""
    vocab = logits.shape[-1]
    values, ids = logits.topk(width, dim=-1) if width < vocab else logits.sort(dim=-1, descending=True)
    drop = torch.arange(width, device=logits.device)[None, :] >= ks[:, None]
    masked = values.masked_fill(drop, float("-inf"))
    lse = torch.where(ks < vocab, torch.logsumexp(masked, dim=-1), full_lse)
    probs = (masked - lse[:, None]).exp()
    drop |= probs.cumsum(dim=-1) - probs >= top_ps[:, None]  # the smallest prefix reaching top_p
    drop |= probs < min_ps[:, None] * probs[:, :1]
    # Covered: a top-k set that fits (its normaliser is then exact), or, without top-k, a last
    # candidate already filtered (every later token is less likely, and so filtered too).
    covered = (ks <= width) | ((ks == vocab) & drop[:, -1])
    return values.masked_fill(drop, float("-inf")), ids, covered
