"""The sampled pick: each random row is one uniform draw through the inverse of its CDF, in the
C++ op (its routines for this CPU's tier, AVX2 and scalar) and in torch, checked against a float64
CDF; the Sampler's seeds, temperatures and filters on top of it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kernels import cpu_attention, cpu_build
from engine.platform import machine
from engine.sample.sampler import CANDIDATES, Sampler, _filtered_draw, draw_torch, filter_rows
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

# The op's routines: this CPU's best (None), the 8-lane ones (x86: AVX2), scalar.
OP_PICKS: list[str | None] = [None, "avx2" if machine.cpu().arch == "x86_64" else "neon", "scalar"]
PICKS = ["torch", *OP_PICKS]


def pick(kind: str | None, logits: torch.Tensor, inv_temps: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    if kind == "torch":
        return draw_torch(logits, inv_temps, uniforms)
    if not cpu_attention.available():
        if cpu_build.compiler() is None:
            pytest.skip("no C++ compiler: the op cannot be built here")
        pytest.fail("the C++ op is not built: run `make kernels`")
    return cpu_attention.sample_pick(logits, inv_temps, uniforms, isa=kind)


def assert_inverts_cdf(
    logits: torch.Tensor, inv_temps: torch.Tensor, uniforms: torch.Tensor, got: torch.Tensor
) -> None:
    """Each answer j is where the float64 CDF passes u: cdf[j-1] <= u <= cdf[j] (to rounding), and
    the token has weight."""
    probs = torch.softmax(logits.double() * inv_temps.double()[:, None], dim=-1)
    cdf = probs.cumsum(dim=-1)
    for b, j in enumerate(got.tolist()):
        u = uniforms[b].item()
        below = cdf[b, j - 1].item() if j > 0 else 0.0
        assert below <= u + 1e-5 and cdf[b, j].item() >= u - 1e-5, (b, j, u, below, cdf[b, j].item())
        assert probs[b, j] > 0


@pytest.mark.parametrize("kind", PICKS, ids=str)
@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 9),
    vocab=st.integers(1, 300),
    temperature=st.sampled_from([0.3, 1.0, 2.5]),
    masked=st.floats(0.0, 0.9),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_pick_inverts_the_cdf(
    kind: str | None, rows: int, vocab: int, temperature: float, masked: float, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 4
    logits[torch.rand(rows, vocab, generator=gen) < masked] = float("-inf")
    logits[:, torch.randint(vocab, (1,), generator=gen)] = 1.0  # every row keeps a token
    inv_temps = torch.full((rows,), 1 / temperature)
    uniforms = torch.rand(rows, dtype=torch.float64, generator=gen)
    uniforms[0] = 0.0  # the first token with weight
    got = pick(kind, logits, inv_temps, uniforms)
    assert_inverts_cdf(logits, inv_temps, uniforms, got)


@pytest.mark.parametrize("kind", PICKS, ids=str)
def test_evenly_spaced_draws_reproduce_the_distribution(kind: str | None) -> None:
    """n draws at u = (k + 1/2) / n land on each token n * p times, to one draw."""
    n = 4000
    row = torch.tensor([2.0, -1.0, 0.5, float("-inf"), 3.0, 0.0, -3.0, 1.5])
    logits = row.repeat(n, 1)
    inv_temps = torch.full((n,), 1 / 0.7)
    uniforms = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    counts = torch.bincount(pick(kind, logits, inv_temps, uniforms), minlength=len(row)).double()
    expected = torch.softmax(row.double() / 0.7, dim=0) * n
    assert counts[3] == 0
    assert (counts - expected).abs().max() <= 1.0 + 1e-9, (counts, expected)


@pytest.mark.parametrize("kind", OP_PICKS, ids=str)
def test_bf16_logits_are_read_as_they_are(kind: str | None) -> None:
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(16, 49152, generator=gen) * 3).bfloat16()
    inv_temps = torch.ones(16)
    uniforms = torch.rand(16, dtype=torch.float64, generator=gen)
    got = pick(kind, logits, inv_temps, uniforms)
    assert torch.equal(got, pick(kind, logits.float(), inv_temps, uniforms))
    assert_inverts_cdf(logits.float(), inv_temps, uniforms, got)


@pytest.mark.parametrize("kind", OP_PICKS, ids=str)
def test_a_nan_row_answers_its_first_nan_and_others_are_untouched(kind: str | None) -> None:
    logits = torch.zeros(3, 40)
    logits[1, 17] = logits[1, 30] = float("nan")
    uniforms = torch.tensor([0.99, 0.5, 0.01], dtype=torch.float64)
    got = pick(kind, logits, torch.ones(3), uniforms).tolist()
    assert got == [39, 17, 0]


def test_a_seeded_request_draws_the_same_tokens_whatever_shares_its_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    row = torch.randn(1, 500, generator=gen)
    seeded = SamplingParams(temperature=1.2, seed=77, max_tokens=4)
    alone, crowded = Sampler(), Sampler()
    others = [SamplingParams(temperature=1.0, max_tokens=4), SamplingParams(temperature=0, max_tokens=4)]
    first, second = [], []
    for _ in range(20):
        first.append(alone.sample(row, [seeded], ["s"])[0])
        batch = torch.cat([torch.randn(1, 500, generator=gen), row, torch.randn(1, 500, generator=gen)])
        second.append(crowded.sample(batch, [others[0], seeded, others[1]], ["a", "s", "b"])[1])
    assert first == second
    assert len(set(first)) > 1  # it did sample


def test_greedy_rows_beside_random_ones_and_the_filters() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 1000, generator=gen) * 2
    params = [
        SamplingParams(temperature=0, max_tokens=1),
        SamplingParams(temperature=1.0, top_k=1, seed=3, max_tokens=1),  # top_k 1 is greedy
        SamplingParams(temperature=0.9, top_k=20, top_p=0.8, seed=4, max_tokens=1),
        SamplingParams(temperature=1.0, seed=5, max_tokens=1),
    ]
    top20 = set(logits[2].topk(20).indices.tolist())
    sampler = Sampler()
    for _ in range(30):
        got = sampler.sample(logits, params, ["g", "k1", "kp", "t"])
        assert got[0] == logits[0].argmax().item()
        assert got[1] == logits[1].argmax().item()
        assert got[2] in top20


def reference_filter(logits: torch.Tensor, k: int, p: float, min_p: float) -> set[int]:
    """The kept tokens of one row by a full sort: top-k, top-p over what top-k kept, min_p."""
    values, order = logits.sort(descending=True)
    if 0 < k < len(values):
        values[k:] = float("-inf")
    probs = torch.softmax(values.double(), dim=0)
    keep = (probs.cumsum(0) - probs < p) & (probs >= min_p * probs[0]) & (values > float("-inf"))
    return set(order[keep].tolist())


@pytest.mark.parametrize("scale", [12.0, 1.0])  # peaked (the candidates hold it), flat (a full sort)
def test_the_filters_keep_what_a_full_sort_keeps(scale: float) -> None:
    gen = torch.Generator().manual_seed(7)
    cases = [(0, 0.9, 0.0), (5, 1.0, 0.0), (40, 0.8, 0.0), (0, 1.0, 0.05), (2000, 0.95, 0.0), (0, 0.5, 0.01)]
    logits = torch.randn(len(cases), 49152, generator=gen) * scale
    ks = torch.tensor([k or 49152 for k, _, _ in cases])
    ps = torch.tensor([p for _, p, _ in cases])
    mins = torch.tensor([m for _, _, m in cases])
    full_lse = torch.logsumexp(logits, dim=-1)
    wide = filter_rows(logits, ks, ps, mins, full_lse, 49152)
    narrow = filter_rows(logits, ks, ps, mins, full_lse, CANDIDATES)
    assert bool(wide[2].all())
    for row, (k, p, min_p) in enumerate(cases):
        expected = reference_filter(logits[row].clone(), k, p, min_p)
        assert set(wide[1][row][wide[0][row] > float("-inf")].tolist()) == expected, (row, k, p, min_p)
        if narrow[2][row]:  # where the candidates say they hold the kept set, they do
            assert set(narrow[1][row][narrow[0][row] > float("-inf")].tolist()) == expected
    assert bool(narrow[2][torch.tensor([0 < k <= CANDIDATES for k, _, _ in cases])].all())  # top-k sets that fit
    assert bool(narrow[2][torch.tensor([k == 0 for k, _, _ in cases])].all()) == (scale > 5)  # flat: a full sort
    uniforms = torch.rand(len(cases), dtype=torch.float64, generator=gen)
    tokens = _filtered_draw(logits, [k for k, _, _ in cases], ps.tolist(), mins.tolist(), uniforms)
    for row, (k, p, min_p) in enumerate(cases):
        assert tokens[row].item() in reference_filter(logits[row].clone(), k, p, min_p)


def test_rows_without_filters_are_not_filtered_beside_one_that_is() -> None:
    """A row with neither top-k, top-p nor min_p draws from its whole distribution even when
    another row of the batch filters: its seeded draw is the one it makes alone."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3000, generator=gen)
    plain = SamplingParams(temperature=1.0, seed=11, max_tokens=1)
    alone = [Sampler().sample(logits[1:], [plain], ["p"])[0]]
    beside = Sampler().sample(logits, [SamplingParams(temperature=1.0, top_k=3, max_tokens=1), plain], ["k", "p"])
    assert beside[1] == alone[0]
    assert beside[0] in set(logits[0].topk(3).indices.tolist())
