"""The C++ CPU attention op (engine/kernels/csrc/) against a float64 dense reference and the torch
implementation, on random varlen batches: decodes and prefill chunks over cached prefixes in one
call, shuffled block ids, caches NaN wherever no sequence wrote, outputs poisoned with NaN. Each
routine family runs (the op capped at scalar, at AVX2, and at this CPU's tier), and the op's own
probe of the tier agrees with engine/platform/machine.py's, SERVELAB_CPU_ISA included.

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
from engine.platform import machine
from tests.support.attention_cases import cdiv, dense_attention, empty_cache

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
# fp16 outputs are rounded to 11 bits: one step is 2e-3 of values in [2, 4).
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 3e-3}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# The op capped at each routine family: scalar, the 8-lane one (x86: AVX2), this CPU's best.
ISAS: list[str | None] = ["scalar", "avx2" if machine.cpu().arch == "x86_64" else "neon", None]


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
    b: dict, scale: float, split_tokens: int = 0, isa: str | None = None, sdpa_from: int = 0, amx: bool = True
) -> torch.Tensor:
    out = torch.full_like(b["q"], float("nan"))
    args = (b["q"], b["k_cache"], b["v_cache"], b["block_tables"], b["seq_lens"], b["query_start_loc"], scale)
    cpu_attention.paged_attention_out(out, *args, split_tokens, cpu_attention.isa_index(isa), sdpa_from, amx)
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
    group=st.integers(1, 8),
    kvh=st.sampled_from([1, 2]),
    head_dim=st.sampled_from([24, 40, 64, 128]),  # 24, 40: the AVX2 fold alone (not multiples of 16)
    dtype=st.sampled_from(DTYPES),
    heads_outer=st.booleans(),
    isa=st.sampled_from(ISAS),
    split_tokens=st.sampled_from([0, 8, 32]),
    sdpa_from=st.sampled_from([0, 2, 16]),  # 0: every chunk in the op's loops; else long ones to a GEMM path
    amx=st.booleans(),  # that path: AMX tiles (bf16, on an AMX CPU) or torch's SDPA
    seed=st.integers(0, 10_000),
)
@example([(0, 1)], 16, 3, 1, 64, torch.float32, True, None, 0, 0, True, 0)  # context 1
@example([(300, 1)], 16, 3, 1, 64, torch.bfloat16, True, None, 16, 0, True, 1)  # one long decode, split
@example([(37, 1), (0, 23), (5, 1)], 16, 4, 2, 128, torch.float32, False, "scalar", 0, 0, True, 2)
@example([(37, 1), (0, 23), (5, 9)], 4, 3, 2, 64, torch.bfloat16, True, None, 0, 2, True, 3)
@example([(300, 70), (0, 2), (13, 40)], 16, 3, 1, 64, torch.bfloat16, True, None, 0, 2, True, 4)  # many key chunks
@example([(90, 33)], 16, 4, 2, 128, torch.bfloat16, False, None, 0, 2, True, 5)
@example([(300, 1), (0, 1), (6, 17)], 16, 8, 1, 128, torch.float16, True, ISAS[1], 16, 0, True, 6)
@example([(33, 1), (0, 29)], 4, 5, 2, 40, torch.bfloat16, False, ISAS[1], 0, 0, True, 7)
def test_matches_float64_dense(
    spans: list[tuple[int, int]],
    block_size: int,
    group: int,
    kvh: int,
    head_dim: int,
    dtype: torch.dtype,
    heads_outer: bool,
    isa: str | None,
    split_tokens: int,
    sdpa_from: int,
    amx: bool,
    seed: int,
) -> None:
    b = varlen_batch(spans, kvh, group, head_dim, block_size, dtype, heads_outer, seed)
    out = run_op(b, head_dim**-0.5, split_tokens, isa, sdpa_from, amx)
    assert_dense(b, spans, out, dtype)


def assert_dense(b: dict, spans: list[tuple[int, int]], out: torch.Tensor, dtype: torch.dtype) -> None:
    starts = b["query_start_loc"].tolist()
    tol = TOLERANCE[dtype]
    for i, (cached, new) in enumerate(spans):
        want = dense_attention(b["q"][starts[i] : starts[i + 1]].double(), b["keys"][i], b["values"][i], cached)
        torch.testing.assert_close(out[starts[i] : starts[i + 1]].double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("isa", ISAS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [40, 64, 128])
def test_each_routine_family_on_groups_1_to_8(isa: str | None, dtype: torch.dtype, head_dim: int) -> None:
    """Every group size the decode routines are built for (1..8; AVX2 takes 5..8 in two passes of
    rows), beside prefill chunks (the fold) and a decode split over keys, at each tier cap."""
    spans = [(45, 1), (0, 1), (300, 1), (20, 19), (0, 9), (7, 1)]
    for group in range(1, 9):
        b = varlen_batch(spans, 1, group, head_dim, 16, dtype, group % 2 == 0, seed=group)
        assert_dense(b, spans, run_op(b, head_dim**-0.5, split_tokens=64, isa=isa), dtype)


@settings(max_examples=30, deadline=None)
@given(
    spans=spans_strategy,
    block_size=st.sampled_from([8, 16]),
    group=st.integers(1, 8),
    head_dim=st.sampled_from([40, 64, 128]),
    heads_outer=st.booleans(),
    isa=st.sampled_from(ISAS),
    seed=st.integers(0, 10_000),
)
def test_matches_torch_reference(
    spans: list[tuple[int, int]],
    block_size: int,
    group: int,
    head_dim: int,
    heads_outer: bool,
    isa: str | None,
    seed: int,
) -> None:
    """fp32: the op in one varlen call equals the torch decode and prefill functions per part."""
    b = varlen_batch(spans, 2, group, head_dim, block_size, torch.float32, heads_outer, seed, nan=False)
    scale = head_dim**-0.5
    out = run_op(b, scale, isa=isa)
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
    """As the tier says (SERVELAB_CPU_ISA below amx turns the tiles off too), and without a cap as
    /proc/cpuinfo does."""
    if os.environ.get("SERVELAB_AMX") == "0":
        pytest.skip("SERVELAB_AMX=0 turns the tiles off")
    assert cpu_attention.has_amx() == (machine.cpu().tier == "amx")
    if machine.cpu().override is None:
        flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
        assert cpu_attention.has_amx() == ("amx_bf16" in flags and "amx_tile" in flags and "avx512_bf16" in flags)


def test_the_dispatcher_picks_the_op_on_cpu() -> None:
    assert pick_impl(None, torch.empty(1)) == "cpu"


def test_the_op_probes_the_tier_engine_machine_does() -> None:
    assert cpu_attention.cpu_isa() == machine.cpu().tier


CAPPED_RUN = """
import sys, torch
from engine.platform import machine
from engine.kernels import cpu_attention
assert cpu_attention.available()
batches, outs = torch.load(sys.argv[1]), {}
for name, b in batches.items():
    outs[name] = torch.full_like(b["q"], float("nan"))
    args = (b["q"], b["k_cache"], b["v_cache"], b["block_tables"], b["seq_lens"], b["query_start_loc"], 0.125)
    cpu_attention.paged_attention_out(outs[name], *args, 1 << 30, -1, 0, True)
torch.save(outs, sys.argv[2])
print(cpu_attention.cpu_isa(), machine.cpu().tier)
"""


def test_servelab_cpu_isa_caps_the_op_to_the_same_routines_as_its_isa_argument(tmp_path: Path) -> None:
    """Under SERVELAB_CPU_ISA=avx2 the op says avx2, as engine/platform/machine.py does, and computes
    bit for bit what `isa="avx2"` computes here: decodes and a prefill chunk, bf16 and fp16."""
    info = machine.cpu()
    if info.arch != "x86_64" or machine.X86_TIERS.index(info.tier) < 1:
        pytest.skip("this process runs no AVX2 (the CPU, or SERVELAB_CPU_ISA=scalar)")
    batches = {
        str(dtype): varlen_batch([(45, 1), (300, 1), (20, 19)], 2, 4, 64, 16, dtype, True, seed=3)
        for dtype in (torch.bfloat16, torch.float16)
    }
    torch.save(batches, tmp_path / "batches.pt")
    full = {**os.environ, "PYTHONPATH": str(ROOT), "SERVELAB_CPU_ISA": "avx2"}
    argv = [sys.executable, "-c", CAPPED_RUN, str(tmp_path / "batches.pt"), str(tmp_path / "out.pt")]
    run = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["avx2", "avx2"]
    there = torch.load(tmp_path / "out.pt")
    for name, b in batches.items():
        assert torch.equal(there[name], run_op(b, 0.125, 1 << 30, isa="avx2")), name


def test_the_op_refuses_an_unknown_tier_and_caps_a_high_one_at_the_hardware() -> None:
    """Its own check, for a library loaded without engine/platform/machine.py's (which refuses both first).
    The library reads SERVELAB_CPU_ISA once per process: each cap needs a new one."""
    code = (
        "import torch; from engine.kernels import cpu_build; "
        "torch.ops.load_library(str(cpu_build.library_path())); print(torch.ops.servelab.cpu_isa())"
    )
    top = (machine.X86_TIERS if machine.cpu().arch == "x86_64" else machine.ARM_TIERS)[-1]
    runs = {
        cap: subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": str(ROOT), "SERVELAB_CPU_ISA": cap},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        for cap in ("pentium", top)
    }
    assert runs["pentium"].returncode != 0 and "SERVELAB_CPU_ISA=pentium: this build's tiers" in runs["pentium"].stderr
    assert runs[top].returncode == 0, runs[top].stderr
    assert runs[top].stdout.split()[-1] == machine.cpu().hardware_tier


def test_without_the_op_the_engine_runs_the_torch_path(
    monkeypatch: pytest.MonkeyPatch, llm_fp32: Any, hf_reference: dict[str, Any]
) -> None:
    """What a machine without a compiler gets: the dispatcher falls back and the engine is still right."""
    from engine import SamplingParams
    from tests.support.hf_check import expected

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


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 9),
    vocab=st.integers(1, 70),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    ties=st.booleans(),
    nans=st.integers(0, 2),
    isa=st.sampled_from(ISAS),
    seed=st.integers(0, 10_000),
)
def test_greedy_pick_is_torch_max(
    rows: int, vocab: int, dtype: torch.dtype, ties: bool, nans: int, isa: str | None, seed: int
) -> None:
    """The C++ greedy pick against torch.max(dim).indices: ties (the first wins), NaN (the first
    NaN wins), -inf rows, vocabularies that are not multiples of 16 or 8, both dtypes, each tier."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen)
    if ties:
        logits = logits.round()  # many equal values, several tied maxima
    for _ in range(nans):
        logits[torch.randint(rows, (1,), generator=gen), torch.randint(vocab, (1,), generator=gen)] = float("nan")
    logits[0] = float("-inf")
    logits = logits.to(dtype)
    assert torch.equal(cpu_attention.greedy_pick(logits, isa), logits.max(dim=-1).indices)


@pytest.mark.parametrize("isa", ISAS, ids=str)
def test_greedy_pick_on_the_model_vocabulary(isa: str | None) -> None:
    logits = torch.randn(64, 49152, generator=torch.Generator().manual_seed(1)).bfloat16()
    logits[5, 40000] = 100.0
    logits[6, [3, 30000]] = 100.0  # a tie: the first
    logits[7, [49151, 9]] = float("nan")  # the first NaN, wherever the max is
    assert torch.equal(cpu_attention.greedy_pick(logits, isa), logits.float().max(dim=-1).indices)
