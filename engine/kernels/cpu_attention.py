"""The C++ CPU path of engine/kernels/attention.py: one op for decode and chunked prefill that
reads K/V blocks in place through the block table (engine/kernels/csrc/: ops_cpu.cpp the entry
points, paged_attention_cpu.cpp the loops, prefill_amx.cpp long chunks on AMX tiles), and the
cache write. Registered as torch.ops.servelab.* with fake implementations, so
torch.compile keeps them as opaque ops.

The library is built by `make kernels` (engine/kernels/cpu_build.py), never here: when it is not
there, or SERVELAB_CPU_KERNELS=0, available() is False and the dispatcher runs the torch path.

Which routines the op runs (scalar, AVX2, AVX-512, AMX; ARM64: scalar) follows the process's CPU
tier, engine.platform.machine.cpu().tier, which the op probes itself (csrc/cpu_isa.h) under the same
SERVELAB_CPU_ISA cap; an `isa` argument caps one call further (tests, benches).
"""

from __future__ import annotations

import functools
import os

import torch

from engine.platform import machine

# Query chunks of at least this many tokens leave the op's own loops for a GEMM path: AMX tiles
# (prefill_amx.cpp) on a CPU that has them, bf16, from AMX_FROM tokens; else torch's CPU flash
# attention over the sequence's gathered blocks, from SDPA_FROM. Measured against the loops
# (bench/attention_op_bench.py): the tiles win from 8 query tokens, SDPA from about 64.
SDPA_FROM = 64
AMX_FROM = 8


@functools.cache
def available() -> bool:
    """Whether the op is loaded (loading it the first time it is asked)."""
    if os.environ.get("SERVELAB_CPU_KERNELS", "1") == "0":
        return False
    from engine.kernels import cpu_build  # here: `python -m engine.kernels.cpu_build` imports this package

    path = cpu_build.library_path()
    if not path.exists():
        return False
    torch.ops.load_library(str(path))
    _register_fakes()
    return True


def _register_fakes() -> None:
    @torch.library.register_fake("servelab::paged_attention")
    def _(q: torch.Tensor, *_: object) -> torch.Tensor:
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.register_fake("servelab::linear_prepacked")
    def _(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
        return x.new_empty(*x.shape[:-1], out_features)

    @torch.library.register_fake("servelab::linear_int8")
    def _(x: torch.Tensor, packed: torch.Tensor, w_scale: torch.Tensor, w_zp: torch.Tensor, out_features: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], out_features)

    @torch.library.register_fake("servelab::greedy_pick")
    def _(logits: torch.Tensor, *_: object) -> torch.Tensor:
        return logits.new_empty(logits.shape[0], dtype=torch.long)

    @torch.library.register_fake("servelab::sample_pick")
    def _(logits: torch.Tensor, *_: object) -> torch.Tensor:
        return logits.new_empty(logits.shape[0], dtype=torch.long)

    @torch.library.register_fake("servelab::paged_attention_out")
    @torch.library.register_fake("servelab::store_kv")
    def _(*_: object) -> None:
        return None


def cpu_isa() -> str:
    """The tier the op runs at in this process, as it probed it (engine.platform.machine.cpu().tier's name)."""
    return str(torch.ops.servelab.cpu_isa())


def isa_index(isa: str | None) -> int:
    """The op's `isa` argument for a tier name: its index in this architecture's tiers (the op runs
    the lower of it and its own tier); None: -1, the process's tier."""
    if isa is None:
        return -1
    tiers = machine.X86_TIERS if machine.cpu().arch == "x86_64" else machine.ARM_TIERS
    if isa not in tiers:
        raise ValueError(f"isa={isa!r}: this CPU's tiers are {', '.join(tiers)}")
    return tiers.index(isa)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    split_tokens: int = 0,
    isa: str | None = None,
    sdpa_from: int | None = None,
    amx: bool | None = None,
) -> torch.Tensor:
    """Varlen attention over the paged cache. q [T, H, D] holds each sequence's last query tokens,
    sequence b's at rows query_start_loc[b]:query_start_loc[b+1]; seq_lens[b] counts its tokens
    including those; block_tables [B, max_blocks]; metadata int32. Returns [T, H, D].
    split_tokens: the fewest keys per split-KV part (0: the op's default); isa: run no routines
    above this tier ("scalar", "avx2", ...: tests, benches; None: the process's); sdpa_from:
    chunks of at least this many tokens take the GEMM path
    (0: never; None: long_chunk_path's); amx=False: that path is torch's SDPA even where AMX tiles
    could take it (tests, benches); None: has_amx()."""
    if amx is None:
        amx = has_amx()
    if sdpa_from is None:
        sdpa_from = long_chunk_path(q.dtype, q.shape[-1])[0] if amx else SDPA_FROM
    args = (q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, split_tokens, isa_index(isa))
    return torch.ops.servelab.paged_attention(*args, sdpa_from, amx)


def linear_prepacked(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """x @ W.T for W prepacked by oneDNN (mkldnn::_linear_pointwise), as an opaque op that
    torch.compile keeps (Inductor lowers oneDNN's own op only for frozen weights)."""
    return torch.ops.servelab.linear_prepacked(x, packed, out_features)


@functools.cache
def has_amx() -> bool:
    """Whether this CPU gives the op AMX tiles (the long-chunk path's fastest); SERVELAB_AMX=0
    says no (benches compare the paths in two processes)."""
    if os.environ.get("SERVELAB_AMX", "1") == "0":
        return False
    return available() and bool(torch.ops.servelab.has_amx())


def long_chunk_path(dtype: torch.dtype, head_dim: int) -> tuple[int, bool]:
    """(the shortest query chunk the op hands to its GEMM path, whether that path is AMX tiles):
    (AMX_FROM, True) where the tiles take it (bf16, head_dim a multiple of 64, an AMX CPU), else
    (SDPA_FROM, False)."""
    if dtype == torch.bfloat16 and head_dim % 64 == 0 and has_amx():
        return AMX_FROM, True
    return SDPA_FROM, False


def greedy_pick(logits: torch.Tensor, isa: str | None = None) -> torch.Tensor:
    """Row-wise argmax of CPU logits [B, V] (float32 or bfloat16), as torch.max(dim).indices.
    isa: as paged_attention's."""
    return torch.ops.servelab.greedy_pick(logits.contiguous(), isa_index(isa))


def sample_pick(
    logits: torch.Tensor, inv_temperature: torch.Tensor, uniforms: torch.Tensor, isa: str | None = None
) -> torch.Tensor:
    """One draw per row of CPU logits [B, V] (float32 or bfloat16) from softmax(logits *
    inv_temperature[b]), by inverting the row's CDF at uniforms[b] (float64 in [0, 1)).
    isa: as paged_attention's."""
    return torch.ops.servelab.sample_pick(
        logits.contiguous(), inv_temperature.float().contiguous(), uniforms.double().contiguous(), isa_index(isa)
    )


def paged_attention_out(out: torch.Tensor, *args: object) -> None:
    """paged_attention writing into out (like q): the tests poison it first."""
    torch.ops.servelab.paged_attention_out(out, *args)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    torch.ops.servelab.store_kv(k, v, k_cache, v_cache, slot_mapping)


def decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """paged_attention_decode's signature: one query token per sequence."""
    starts = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return paged_attention(q, k_cache, v_cache, block_tables.int(), context_lens.int(), starts, scale)


def prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    num_cached: int,
    scale: float,
) -> torch.Tensor:
    """prefill_attention's signature: one sequence's chunk after num_cached cached tokens."""
    n = q.shape[0]
    starts = torch.tensor([0, n], dtype=torch.int32)
    lens = torch.tensor([num_cached + n], dtype=torch.int32)
    return paged_attention(q, k_cache, v_cache, block_table.int()[None], lens, starts, scale)
