"""Speculative decoding's parts, without the model: the n-gram guesses, the greedy check, and the
rejection sampling that keeps the target distribution."""

from __future__ import annotations

import random
from array import array

import pytest
import torch

from engine.config import EngineConfig
from engine.errors import InvalidParamError
from engine.sample.sampler import target_probs
from engine.sample.spec_decode import propose
from engine.sample.spec_verify import accept_greedy, accept_sampled
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit


def test_propose_takes_the_longest_suffix_then_its_earliest_match() -> None:
    # vLLM's NgramProposer docstring example: [4, 2, 3] has no earlier match, [2, 3] has.
    assert propose([1, 2, 3, 4, 2, 3], 4, 2, 3) == [4, 2, 3]
    assert propose([1, 2, 3, 4, 1, 2, 3], 2, 2, 2) == [4, 1]  # the earliest [2, 3]
    assert propose([9, 1, 2, 7, 1, 2, 8, 9, 1, 2], 2, 2, 3) == [7, 1]  # [9, 1, 2] before [1, 2]
    assert propose([5, 5, 5, 5], 3, 1, 2) == [5, 5]  # a match may overlap the suffix
    assert propose([1, 2, 3], 4, 2, 4) == []  # nothing repeats
    assert propose([1, 2], 4, 2, 4) == []  # no longer than the shortest n-gram
    assert propose([1, 2, 1, 2], 0, 1, 2) == []


def test_propose_matches_whole_ids_only() -> None:
    """The search runs over the ids' bytes: a match straddling two ids is not one."""
    # Little-endian bytes 07 01 00 00 | 00 02 00 00 | 00 03 00 00: from byte 1 they read as the
    # ids 1, 2, but no id boundary starts there.
    ids = [0x0107, 0x0200, 0x0300]
    assert array("i", ids).tobytes()[1:9] == array("i", [1, 2]).tobytes()
    assert propose([*ids, 1, 2], 2, 2, 2) == []
    assert propose([1, 2, 5, 6, 1, 2], 2, 2, 2) == [5, 6]


def test_greedy_check_keeps_the_agreed_guesses_then_the_models_token() -> None:
    assert accept_greedy([4, 2, 9, 1], [4, 2, 3]) == [4, 2, 9]  # the third guess is wrong
    assert accept_greedy([4, 2, 3, 1], [4, 2, 3]) == [4, 2, 3, 1]  # all kept, and one more
    assert accept_greedy([8, 2, 3, 1], [4, 2, 3]) == [8]  # the first is wrong: one token, as a decode
    assert accept_greedy([0], []) == [0]


def _chi_square(counts: list[int], probs: list[float]) -> float:
    total = sum(counts)
    return sum((c - total * p) ** 2 / (total * p) for c, p in zip(counts, probs) if p > 0)


def test_rejection_sampling_keeps_each_positions_distribution() -> None:
    """A draft held with certainty, kept with probability p(draft), else a token drawn from p
    without it: the first token is distributed as p_0, and the second, after a kept first
    guess, as p_1 (chi-square at a fixed seed, 4 degrees of freedom, bound 18.5: p = 0.001)."""
    vocab, trials = 5, 20_000
    probs = torch.tensor(
        [[0.10, 0.40, 0.20, 0.25, 0.05], [0.30, 0.05, 0.15, 0.20, 0.30], [0.2, 0.2, 0.2, 0.2, 0.2]],
        dtype=torch.float64,
    )
    rng = random.Random(7)
    first, second = [0] * vocab, [0] * vocab
    for _ in range(trials):
        tokens = accept_sampled(probs, [1, 4], rng.random)
        assert 1 <= len(tokens) <= 3
        first[tokens[0]] += 1
        if tokens[0] == 1:  # the first guess was kept: the second token follows p_1
            second[tokens[1]] += 1
    assert _chi_square(first, probs[0].tolist()) < 18.5
    assert _chi_square(second, probs[1].tolist()) < 18.5


def test_rejection_sampling_on_a_vocabulary_slice_matches_the_sampler() -> None:
    """target_probs, as the runner calls it (temperature, then top-k: a slice of 4 tokens of a
    50-token row): the accepted first token follows what sample() would draw from."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 50, generator=gen) * 3
    params = SamplingParams(temperature=0.7, top_k=4)
    probs = target_probs(logits, params)
    assert torch.allclose(probs.sum(dim=-1), torch.ones(2, dtype=torch.float64))
    kept = probs[0].nonzero().flatten().tolist()
    assert len(kept) == 4
    guess = kept[1]
    rng = random.Random(11)
    counts = [0] * 50
    for _ in range(20_000):
        counts[accept_sampled(probs, [guess], rng.random)[0]] += 1
    assert all(counts[t] == 0 for t in range(50) if t not in kept)  # never outside the slice
    assert _chi_square([counts[t] for t in kept], [float(probs[0, t]) for t in kept]) < 16.3  # 3 dof


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"num_speculative_tokens": -1}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 17}, "num_speculative_tokens"),
        ({"spec_lookup_min": 0}, "spec_lookup_min"),
        ({"spec_lookup_min": 5, "spec_lookup_max": 3}, "spec_lookup_min"),
        ({"num_speculative_tokens": 3, "paged": False}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 3, "scheduler_steps": 4}, "num_speculative_tokens"),
    ],
)
def test_bad_speculation_settings_name_the_field(changes: dict, field: str) -> None:
    with pytest.raises(InvalidParamError) as err:
        EngineConfig(**changes)
    assert err.value.param == field
