"""The LLaMA forward pass (RMSNorm, RoPE, GQA, SwiGLU, tied embeddings) over a paged KV cache.

Every token of a step, prefill chunks and decodes alike, goes through the linear layers as one
flat batch; only attention splits them: decodes batched over the paged cache, prefill chunks
one sequence at a time. Q/K/V and gate/up are fused into one matmul each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import Impl, cpu_attention, paged_attention_decode, pick_impl, prefill_attention, store_kv
from engine.model.int8_linear import Int8Weight, int8_linear
from engine.model.llama_config import LlamaConfig  # re-exported: the model's shape, torch-free
from engine.platform import machine


@dataclass
class PrefillChunk:
    start: int  # offset of the chunk's first token in the flat batch
    length: int
    num_cached: int  # tokens of this sequence already in the KV cache
    block_table: torch.Tensor


@dataclass
class AttentionBatch:
    """Where each token's K/V goes and what each query attends to. Decode tokens come first."""

    slot_mapping: torch.Tensor  # [T]
    num_decodes: int
    decode_block_tables: torch.Tensor  # [num_decodes, max_blocks]
    decode_context_lens: torch.Tensor  # [num_decodes]
    prefills: list[PrefillChunk]
    # Every sequence in token order, for the C++ CPU op's one call (all int32; None: not built).
    block_tables: torch.Tensor | None = None  # [S, max_blocks]
    seq_lens: torch.Tensor | None = None  # [S]: tokens in the cache once this step's are written
    query_start_loc: torch.Tensor | None = None  # [S + 1]: sequence b's tokens are [qsl[b], qsl[b+1])


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.input_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.qkv = nn.Parameter(torch.empty(q_size + 2 * kv_size, cfg.hidden_size))
        self.o = nn.Parameter(torch.empty(cfg.hidden_size, q_size))
        self.post_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.gate_up = nn.Parameter(torch.empty(2 * cfg.intermediate_size, cfg.hidden_size))
        self.down = nn.Parameter(torch.empty(cfg.hidden_size, cfg.intermediate_size))
        # oneDNN-blocked copies (Llama.prepack), or the int8 weights themselves (int8_linear.py)
        self.packed: dict[str, torch.Tensor | Int8Weight] = {}


# batch_invariant: every matmul is called with exactly this many rows (the last tile zero-padded).
# The GEMMs here pick their blocking by M: oneDNN's bf16 kernel (AVX-512/AMX) changes it past 32
# rows and MKL's fp32 one at almost every M, so a token's outputs depended on how many tokens
# shared its step; within one fixed shape a row's result does not depend on its neighbours or its
# place among them (measured: bench/batch_invariance.py, tests/test_failures_batch_invariance.py).
INVARIANT_ROWS = 32


def linear(
    x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | Int8Weight | None, invariant: bool = False
) -> torch.Tensor:
    if isinstance(packed, Int8Weight):  # integer sums: batch-invariant as they are
        return int8_linear(x, packed)
    if invariant:
        rows = x.shape[0]
        padded = F.pad(x, (0, 0, 0, -rows % INVARIANT_ROWS))
        return torch.cat([linear(tile, weight, packed) for tile in padded.split(INVARIANT_ROWS)])[:rows]
    if packed is None:
        return F.linear(x, weight)
    if torch.compiler.is_compiling():  # only with the C++ op loaded (engine/model/compile.py)
        return cpu_attention.linear_prepacked(x, packed, weight.shape[0])
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = self.embed if cfg.tie_word_embeddings else nn.Parameter(torch.empty_like(self.embed))
        self.rope_cos = torch.empty(0)
        self.rope_sin = torch.empty(0)
        self.packed_lm_head: torch.Tensor | None = None
        # The one switch between kernels: None picks by device (Triton on CUDA, torch on CPU).
        self.attention_impl: Impl | None = None
        # Tensor parallelism (engine/parallel/distributed.py): sums the row-parallel o/down outputs over ranks.
        self.all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
        # forward_varlen through Inductor (engine/model/compile.py), when the engine compiles.
        self.compiled_forward: Callable[..., torch.Tensor] | None = None
        # Which query chunks the op's GEMM path takes, and whether that is AMX tiles or SDPA
        # (cpu_attention.long_chunk_path): set on the first forward over the op, outside any
        # compiled graph (it asks the CPU).
        self.long_chunks: tuple[int, bool] | None = None
        # The batch_invariant lever: every matmul in fixed tiles of INVARIANT_ROWS rows.
        self.batch_invariant = False

    def prepack(self) -> bool:
        """On an x86-64 CPU: keep each matmul weight also in oneDNN's blocked layout, which ran
        decode matmuls 1.2-1.6x faster in bf16 with bit-identical results and 1.3-3x in fp32,
        where oneDNN runs the dtype on this CPU (engine/platform/machine.py's linear_path: bf16 needs
        AVX-512 or AVX-NE-CONVERT; else F.linear, slower but correct). Returns whether it packed."""
        weight = self.embed
        dtype = {torch.bfloat16: "bfloat16", torch.float32: "float32"}.get(weight.dtype, "")
        if machine.linear_path(dtype, weight.device.type) != "onednn-prepacked":
            return False
        pack = torch.ops.mkldnn._reorder_linear_weight
        for layer in self.layers:
            layer.packed = {name: pack(getattr(layer, name).detach()) for name in ("qkv", "o", "gate_up", "down")}
        self.packed_lm_head = pack(self.lm_head.detach())
        return True

    def packed_bytes(self) -> int:
        """The oneDNN-blocked copies of weights the parameters also hold."""
        packed = [t for layer in self.layers for t in layer.packed.values() if not isinstance(t, Int8Weight)]
        packed += [self.packed_lm_head] if self.packed_lm_head is not None else []
        return sum(t.numel() * t.element_size() for t in packed)

    def int8_bytes(self) -> int:
        """The int8 weights (quantization=int8), which replace their parameters."""
        return sum(t.nbytes for layer in self.layers for t in layer.packed.values() if isinstance(t, Int8Weight))

    def choose_long_chunks(self) -> tuple[int, bool]:
        """long_chunks, asked of the CPU once (before any compiled graph bakes it in)."""
        if self.long_chunks is None:
            self.long_chunks = cpu_attention.long_chunk_path(self.embed.dtype, self.cfg.head_dim)
        return self.long_chunks

    def init_rope(self, device: str | torch.device) -> None:
        cfg = self.cfg
        exponents = torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta**exponents)
        freqs = torch.outer(torch.arange(cfg.max_position, dtype=torch.float32), inv_freq)
        self.rope_cos, self.rope_sin = freqs.cos().to(device), freqs.sin().to(device)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBatch,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """hidden: a later pipeline stage's input, the previous stage's residual stream (the
        first stage embeds input_ids). Returns the residual stream after this model's layers."""
        impl = pick_impl(self.attention_impl, self.embed)
        if impl == "cpu" and attn.seq_lens is not None:  # the C++ op: tensors only, so it compiles
            self.choose_long_chunks()
            meta = (attn.slot_mapping, attn.block_tables, attn.seq_lens, attn.query_start_loc)
            if hidden is not None:  # a pipeline stage never compiles (engine/model/compile.py: one rank)
                return self.forward_varlen(input_ids, positions, *meta, kv_caches, hidden)
            run = self.compiled_forward or self.forward_varlen
            return run(input_ids, positions, *meta, kv_caches)

        def attend(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor
        ) -> torch.Tensor:
            return self._attend_pieces(q, k, v, kc, vc, attn, impl)

        return self._layers(input_ids, positions, kv_caches, attend, hidden)

    def forward_varlen(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The forward over the C++ CPU op: every sequence's attention in one call per layer."""
        scale = self.cfg.head_dim**-0.5
        long_from, amx = self.long_chunks or (cpu_attention.SDPA_FROM, False)
        # batch_invariant: every chunk in the op's loops, never split over keys: which path a
        # chunk takes (its length, the batch's number of work items) would depend on the batch.
        split_tokens = 0
        if self.batch_invariant:
            long_from, amx, split_tokens = 0, False, 1 << 30

        def attend(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor
        ) -> torch.Tensor:
            cpu_attention.store_kv(k, v, kc, vc, slot_mapping)
            return cpu_attention.paged_attention(
                q, kc, vc, block_tables, seq_lens, query_start_loc, scale, split_tokens, sdpa_from=long_from, amx=amx
            )

        return self._layers(input_ids, positions, kv_caches, attend, hidden)

    def _layers(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        attend: Callable[..., torch.Tensor],
        hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        cfg = self.cfg
        eps, inv = cfg.rms_norm_eps, self.batch_invariant
        h = F.embedding(input_ids, self.embed) if hidden is None else hidden
        cos = self.rope_cos.index_select(0, positions).to(h.dtype)
        sin = self.rope_sin.index_select(0, positions).to(h.dtype)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            p = layer.packed
            x = F.rms_norm(h, (cfg.hidden_size,), layer.input_norm, eps)
            qkv = linear(x, layer.qkv, p.get("qkv"), inv)
            attended = self._attention(qkv, cos, sin, attend, k_cache, v_cache)
            h = h + self._reduce(linear(attended, layer.o, p.get("o"), inv))
            x = F.rms_norm(h, (cfg.hidden_size,), layer.post_norm, eps)
            gate, up = linear(x, layer.gate_up, p.get("gate_up"), inv).chunk(2, dim=-1)
            h = h + self._reduce(linear(F.silu(gate) * up, layer.down, p.get("down"), inv))
        return h

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        return partial if self.all_reduce is None else self.all_reduce(partial)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits: what sampling, penalties and logprobs compute with."""
        return self.raw_logits(hidden).float()

    def raw_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in the model's dtype: a greedy pick needs no fp32 copy (widening is exact)."""
        x = F.rms_norm(hidden, (self.cfg.hidden_size,), self.norm, self.cfg.rms_norm_eps)
        return linear(x, self.lm_head, self.packed_lm_head, self.batch_invariant)

    def _attention(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend: Callable[..., torch.Tensor],
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        cfg = self.cfg
        num_tokens, d = qkv.shape[0], cfg.head_dim
        q_size, kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
        q = _rope(qkv[:, :q_size].view(num_tokens, cfg.num_heads, d), cos, sin)
        k = _rope(qkv[:, q_size : q_size + kv_size].view(num_tokens, cfg.num_kv_heads, d), cos, sin)
        v = qkv[:, q_size + kv_size :].view(num_tokens, cfg.num_kv_heads, d)
        return attend(q, k, v, k_cache, v_cache).reshape(num_tokens, q_size)

    def _attend_pieces(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        attn: AttentionBatch,
        impl: Impl,
    ) -> torch.Tensor:
        """torch and Triton: the decodes in one call, then each prefill chunk on its own."""
        store_kv(k, v, k_cache, v_cache, attn.slot_mapping, impl)
        scale = self.cfg.head_dim**-0.5
        outs = []
        nd = attn.num_decodes
        if nd:
            tables, lens = attn.decode_block_tables, attn.decode_context_lens
            outs.append(paged_attention_decode(q[:nd], k_cache, v_cache, tables, lens, scale, impl))
        for chunk in attn.prefills:
            span = slice(chunk.start, chunk.start + chunk.length)
            outs.append(
                prefill_attention(
                    q[span], k[span], v[span], k_cache, v_cache, chunk.block_table, chunk.num_cached, scale, impl
                )
            )
        return outs[0] if len(outs) == 1 else torch.cat(outs)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (HF layout; the GGUF loader undoes llama.cpp's interleaved permutation)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
