"""How a model's work divides, with no torch: heads and rows over tensor-parallel ranks
(split_evenly), layers over pipeline stages (stage_layers, as vLLM splits them). The live engine
(engine/model/sharding.py) and the what-if executor (engine/sim/deployment.py) read the same split."""

from __future__ import annotations

import itertools


def split_evenly(n: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of n items over parts; the first ranks take one more when uneven."""
    base, extra = divmod(n, parts)
    bounds = [0]
    for r in range(parts):
        bounds.append(bounds[-1] + base + (r < extra))
    return list(itertools.pairwise(bounds))


def stage_layers(num_layers: int, pp: int) -> list[int]:
    """Contiguous layers per pipeline stage as vLLM splits them (get_pp_indices): an even share,
    and the remainder one each to the stages before the last (the last also holds the LM head)."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def stage_range(num_layers: int, stage: int, pp: int) -> tuple[int, int]:
    """[lo, hi) of the layers stage keeps."""
    parts = stage_layers(num_layers, pp)
    lo = sum(parts[:stage])
    return lo, lo + parts[stage]
