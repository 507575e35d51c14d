"""The C++ CPU attention op (engine/kernels/csrc/) against a float64 dense reference and the torch
implementation, on random varlen batches: decodes and prefill chunks over cached prefixes in one
call, shuffled block ids, caches NaN wherever no sequence wrote, outputs poisoned with NaN.

`make test` builds the op first (`make kernels`); where a compiler exists but the library does
not, these tests fail rather than skip, so a broken build cannot pass unnoticed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.kernels import cpu_attention, cpu_build, paged_attention_decode, pick_impl, prefill_attention, store_kv
from tests.attention_cases import cdiv, empty_cache
from tests.test_attention_math import dense_attention

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2}


@pytest.fixture(autouse=True)
def _built() -> None:
    if cpu_attention.available():
        return
    if os.environ.get("SERVELAB_CPU_KERNELS") == "0" or cpu_build.compiler() is None:
        pytest.skip("the C++ op is off (SERVELAB_CPU_KERNELS=0) or there is no compiler")
    pytest.fail("the C++ attention op is not built: run `make kernels`")


def varlen_batch(
    spans: list[tuple[int, int]],
    kvh: int,
    group: int,
    d: int,
    bs: int,
    dtype: torch.dtype,
    heads_outer: bool,
    seed: int,
    nan: bool = True,
) -> dict:
    """Sequences given as (cached, new) tokens; their K/V written at shuffled blocks of caches that
    hold NaN (or, for the torch reference, which reads whole blocks, large garbage) elsewhere."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [cdiv(c + n, bs) for c, n in spans]
    num_blocks = sum(per_seq) + 2
    k_cache, v_cache = (empty_cache(num_blocks, bs, kvh, d, dtype, heads_outer) for _ in range(2))
    for cache in (k_cache, v_cache):
        cache.copy_(torch.full(cache.shape, float("nan")) if nan else 100 * torch.randn(cache.shape, generator=gen))
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables, keys, values = [], [], []
    for (cached, new), blocks in zip(spans, per_seq):
        table = [free.pop() for _ in range(blocks)]
        k, v = (torch.randn(cached + new, kvh, d, generator=gen).to(dtype) for _ in range(2))
        pos = torch.arange(cached + new)
        store_kv(k, v, k_cache, v_cache, torch.tensor(table)[pos // bs] * bs + pos % bs, impl="torch")
        tables.append(table)
        keys.append(k)
        values.append(v)
    width = max(per_seq)
    news = [n for _, n in spans]
    return {
        "q": torch.randn(sum(news), kvh * group, d, generator=gen).to(dtype),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_tables": torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        "seq_lens": torch.tensor([c + n for c, n in spans], dtype=torch.int32),
        "query_start_loc": torch.tensor([0, *torch.tensor(news).cumsum(0).tolist()], dtype=torch.int32),
        "keys": keys,
        "values": values,
    }


def run_op(
    b: dict, scale: float, split_tokens: int = 0, simd: bool = True, sdpa_from: int = 0, amx: bool = True
) -> torch.Tensor:
    out = torch.full_like(b["q"], float("nan"))
    args = (b["q"], b["k_cache"], b["v_cache"], b["block_tables"], b["seq_lens"], b["query_start_loc"], scale)
    cpu_attention.paged_attention_out(out, *args, split_tokens, simd, sdpa_from, amx)
    assert not out.isnan().any(), "an output element was not written"
    return out


spans_strategy = st.lists(
    st.one_of(
        st.tuples(st.integers(0, 90), st.just(1)),  # decodes (context 1 when nothing is cached)
        st.tuples(st.integers(0, 40), st.integers(1, 40)),  # prefill chunks
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(
    spans=spans_strategy,
    block_size=st.sampled_from([4, 16, 32]),
    group=st.sampled_from([1, 3, 4]),
    kvh=st.sampled_from([1, 2]),
    head_dim=st.sampled_from([64, 128]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    heads_outer=st.booleans(),
    simd=st.booleans(),
    split_tokens=st.sampled_from([0, 8, 32]),
    sdpa_from=st.sampled_from([0, 2, 16]),  # 0: every chunk in the op's loops; else long ones to a GEMM path
    amx=st.booleans(),  # that path: AMX tiles (bf16, on an AMX CPU) or torch's SDPA
    seed=st.integers(0, 10_000),
)
@example([(0, 1)], 16, 3, 1, 64, torch.float32, True, True, 0, 0, True, 0)  # context 1
@example([(300, 1)], 16, 3, 1, 64, torch.bfloat16, True, True, 16, 0, True, 1)  # one long decode, split
@example([(37, 1), (0, 23), (5, 1)], 16, 4, 2, 128, torch.float32, False, False, 0, 0, True, 2)
@example([(37, 1), (0, 23), (5, 9)], 4, 3, 2, 64, torch.bfloat16, True, True, 0, 2, True, 3)
@example([(300, 70), (0, 2), (13, 40)], 16, 3, 1, 64, torch.bfloat16, True, True, 0, 2, True, 4)  # many key chunks
@example([(90, 33)], 16, 4, 2, 128, torch.bfloat16, False, True, 0, 2, True, 5)
def test_matches_float64_dense(
    spans: list[tuple[int, int]],
    block_size: int,
    group: int,
    kvh: int,
    head_dim: int,
    dtype: torch.dtype,
    heads_outer: bool,
    simd: bool,
    split_tokens: int,
    sdpa_from: int,
    amx: bool,
    seed: int,
) -> None:
    b = varlen_batch(spans, kvh, group, head_dim, block_size, dtype, heads_outer, seed)
    out = run_op(b, head_dim**-0.5, split_tokens, simd, sdpa_from, amx)
    starts = b["query_start_loc"].tolist()
    tol = TOLERANCE[dtype]
    for i, (cached, new) in enumerate(spans):
        want = dense_attention(b["q"][starts[i] : starts[i + 1]].double(), b["keys"][i], b["values"][i], cached)
        torch.testing.assert_close(out[starts[i] : starts[i + 1]].double(), want, rtol=tol, atol=tol)


@settings(max_examples=30, deadline=None)
@given(
    spans=spans_strategy,
    block_size=st.sampled_from([8, 16]),
    group=st.sampled_from([1, 3, 4]),
    head_dim=st.sampled_from([64, 128]),
    heads_outer=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_matches_torch_reference(
    spans: list[tuple[int, int]], block_size: int, group: int, head_dim: int, heads_outer: bool, seed: int
) -> None:
    """fp32: the op in one varlen call equals the torch decode and prefill functions per part."""
    b = varlen_batch(spans, 2, group, head_dim, block_size, torch.float32, heads_outer, seed, nan=False)
    scale = head_dim**-0.5
    out = run_op(b, scale)
    starts = b["query_start_loc"].tolist()
    for i, (cached, new) in enumerate(spans):
        q = b["q"][starts[i] : starts[i + 1]]
        table = b["block_tables"][i : i + 1]
        if new == 1:
            want = paged_attention_decode(
                q, b["k_cache"], b["v_cache"], table, b["seq_lens"][i : i + 1], scale, "torch"
            )
        else:
            k, v = b["keys"][i][cached:], b["values"][i][cached:]
            want = prefill_attention(q, k, v, b["k_cache"], b["v_cache"], table[0], cached, scale, "torch")
        torch.testing.assert_close(out[starts[i] : starts[i + 1]], want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("heads_outer", [False, True])
def test_store_kv_matches_torch(dtype: torch.dtype, heads_outer: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    num_blocks, bs, kvh, d, n = 6, 16, 3, 64, 40
    k, v = (torch.randn(n, kvh, 3 * d, generator=gen).to(dtype)[:, :, d : 2 * d] for _ in range(2))  # strided rows
    slots = torch.randperm(num_blocks * bs, generator=gen)[:n]
    caches = {}
    for impl in ("torch", "cpu"):
        kc, vc = (empty_cache(num_blocks, bs, kvh, d, dtype, heads_outer).zero_() for _ in range(2))
        store_kv(k, v, kc, vc, slots, impl=impl)
        caches[impl] = (kc, vc)
    assert torch.equal(caches["torch"][0], caches["cpu"][0]) and torch.equal(caches["torch"][1], caches["cpu"][1])
    kc, vc = (empty_cache(num_blocks, bs, kvh, d, dtype, heads_outer).zero_() for _ in range(2))
    cpu_attention.store_kv(k, v, kc, vc, torch.full((n,), -1))  # -1: a padding token, written nowhere
    assert not kc.any() and not vc.any()


@pytest.mark.skipif(not cpu_attention.has_amx(), reason="this CPU has no AMX-BF16")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_amx_tiles_over_a_widening_score_range(head_dim: int) -> None:
    """Keys that grow along the sequence move each row's running max again and again: the lazy
    rescale (only past 2^8) must still give the dense answer; long chunks, shuffled blocks."""
    spans = [(0, 333), (170, 90), (0, 9)]
    b = varlen_batch(spans, 2, 3, head_dim, 16, torch.bfloat16, True, 7)
    ids = b["block_tables"].long()
    for i, (cached, new) in enumerate(spans):  # scale each sequence's keys by position, in cache and reference
        n = cached + new
        rows = torch.arange(n)
        blocks, offsets = ids[i][rows // 16], rows % 16
        factor = torch.linspace(0.2, 6.0, n)[:, None, None]
        b["k_cache"][blocks, offsets] = (b["k_cache"][blocks, offsets].float() * factor).bfloat16()
        b["keys"][i] = b["k_cache"][blocks, offsets]
    out = run_op(b, head_dim**-0.5, sdpa_from=8, amx=True)
    starts = b["query_start_loc"].tolist()
    for i, (cached, new) in enumerate(spans):
        want = dense_attention(b["q"][starts[i] : starts[i + 1]].double(), b["keys"][i], b["values"][i], cached)
        tol = TOLERANCE[torch.bfloat16]
        torch.testing.assert_close(out[starts[i] : starts[i + 1]].double(), want, rtol=tol, atol=tol)


def test_amx_is_reported_as_the_cpu_has_it() -> None:
    if os.environ.get("SERVELAB_AMX") == "0":
        pytest.skip("SERVELAB_AMX=0 turns the tiles off")
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    assert cpu_attention.has_amx() == ("amx_bf16" in flags and "amx_tile" in flags and "avx512_bf16" in flags)


def test_the_dispatcher_picks_the_op_on_cpu() -> None:
    assert pick_impl(None, torch.empty(1)) == "cpu"
    assert torch.ops.servelab.has_simd() == bool(torch.backends.cpu.get_cpu_capability().startswith("AVX512"))


def test_without_the_op_the_engine_runs_the_torch_path(
    monkeypatch: pytest.MonkeyPatch, llm_fp32: Any, hf_reference: dict[str, Any]
) -> None:
    """What a machine without a compiler gets: the dispatcher falls back and the engine is still right."""
    from engine import SamplingParams
    from tests.test_hf_equivalence import expected

    def refuse(*_: object) -> None:
        raise AssertionError("the C++ op ran")

    monkeypatch.setattr(cpu_attention, "available", lambda: False)
    monkeypatch.setattr(cpu_attention, "paged_attention", refuse)
    monkeypatch.setattr(cpu_attention, "store_kv", refuse)
    assert pick_impl(None, torch.empty(1)) == "torch"
    refs = hf_reference["prompts"][:3]
    outs = llm_fp32.generate(
        [{"prompt_token_ids": r["prompt_ids"]} for r in refs], SamplingParams(temperature=0, max_tokens=8)
    )
    for ref, out in zip(refs, outs):
        assert out.token_ids == expected(ref)[:8], ref["name"]


def test_build_without_a_compiler_says_so_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "CXX": str(tmp_path / "no-such-c++")}
    run = subprocess.run(
        [sys.executable, "-m", "engine.kernels.cpu_build", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("\n") == 1 and "no C++ compiler" in run.stdout and "torch path" in run.stdout
    assert not list(tmp_path.rglob("*.so"))


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 9),
    vocab=st.integers(1, 70),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    ties=st.booleans(),
    nans=st.integers(0, 2),
    seed=st.integers(0, 10_000),
)
def test_greedy_pick_is_torch_max(rows: int, vocab: int, dtype: torch.dtype, ties: bool, nans: int, seed: int) -> None:
    """The C++ greedy pick against torch.max(dim).indices: ties (the first wins), NaN (the first
    NaN wins), -inf rows, vocabularies that are not multiples of 16, both dtypes."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen)
    if ties:
        logits = logits.round()  # many equal values, several tied maxima
    for _ in range(nans):
        logits[torch.randint(rows, (1,), generator=gen), torch.randint(vocab, (1,), generator=gen)] = float("nan")
    logits[0] = float("-inf")
    logits = logits.to(dtype)
    assert torch.equal(cpu_attention.greedy_pick(logits), logits.max(dim=-1).indices)


def test_greedy_pick_on_the_model_vocabulary() -> None:
    logits = torch.randn(64, 49152, generator=torch.Generator().manual_seed(1)).bfloat16()
    logits[5, 40000] = 100.0
    logits[6, [3, 30000]] = 100.0  # a tie: the first
    assert torch.equal(cpu_attention.greedy_pick(logits), logits.float().max(dim=-1).indices)
