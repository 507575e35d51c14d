"""Sharding a LLaMA model: which slice of every layer's weights a tensor-parallel rank keeps, and
which layers a pipeline stage keeps.

Q/K/V and gate/up split by output rows (column-parallel), o and down by input columns
(row-parallel, summed by an all-reduce in engine/parallel/distributed.py). Heads split by KV group, as
evenly as they go (SmolLM2-135M's 3 groups split 2 + 1 for two ranks); the embedding and the
tied LM head stay whole on every rank.

Pipeline stages keep contiguous layers, split as vLLM splits them (stage_layers). The first stage
embeds, and the last computes the logits of the rows rank 0 samples (vLLM's last stage holds the
LM head); the first keeps the head too (tied to the embeddings in SmolLM2: no extra bytes), for
the rare step whose prompt logprobs need every row; stages between hold their layers only."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from engine.errors import InvalidParamError
from engine.model.llama import Llama, LlamaConfig
from engine.model.partition import split_evenly, stage_range


def check_split(cfg: LlamaConfig, tp: int, pp: int) -> None:
    """InvalidParamError naming the lever where the model cannot split so (before any rank spawns)."""
    if tp > cfg.num_kv_heads:
        raise InvalidParamError(
            "tensor_parallel", f"at most the model's {cfg.num_kv_heads} KV heads (heads split by KV group)"
        )
    if pp > cfg.num_layers:
        raise InvalidParamError("pipeline_parallel", f"at most the model's {cfg.num_layers} layers")


def keep_stage(model: Llama, stage: int, pp: int) -> Llama:
    """Keep only stage's layers, in place; model.cfg.num_layers becomes the stage's, so the runner
    allocates KV for those layers alone. The stages between drop the embeddings and the head."""
    cfg = model.cfg
    check_split(cfg, 1, pp)
    lo, hi = stage_range(cfg.num_layers, stage, pp)
    model.layers = nn.ModuleList(list(model.layers)[lo:hi])
    if stage > 0:  # only the first stage embeds; the last computes the sampled rows' logits
        empty = nn.Parameter(model.embed.data.new_empty(0, cfg.hidden_size), requires_grad=False)
        if stage < pp - 1:
            model.embed, model.lm_head, model.packed_lm_head = empty, empty, None
        elif not cfg.tie_word_embeddings:  # tied, the embeddings are the head
            model.embed = empty
    model.cfg = replace(cfg, num_layers=hi - lo)
    return model


def shard_model(model: Llama, rank: int, world: int) -> Llama:
    """Keep only rank's shard of every layer's weights, in place; model.cfg becomes the shard's
    (its head counts and intermediate size), so attention and the KV cache need no other change."""
    cfg = model.cfg
    check_split(cfg, world, 1)
    d, per_group = cfg.head_dim, cfg.num_heads // cfg.num_kv_heads
    g_lo, g_hi = split_evenly(cfg.num_kv_heads, world)[rank]
    i_lo, i_hi = split_evenly(cfg.intermediate_size, world)[rank]
    q_size, kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
    q_rows = slice(g_lo * per_group * d, g_hi * per_group * d)
    kv_rows = slice(g_lo * d, g_hi * d)

    def keep(t: torch.Tensor) -> nn.Parameter:
        return nn.Parameter(t.contiguous(), requires_grad=False)

    for layer in model.layers:
        qkv = layer.qkv.data
        q, k, v = qkv[:q_size], qkv[q_size : q_size + kv_size], qkv[q_size + kv_size :]
        layer.qkv = keep(torch.cat([q[q_rows], k[kv_rows], v[kv_rows]]))
        layer.o = keep(layer.o.data[:, q_rows])
        gate, up = layer.gate_up.data.chunk(2)
        layer.gate_up = keep(torch.cat([gate[i_lo:i_hi], up[i_lo:i_hi]]))
        layer.down = keep(layer.down.data[:, i_lo:i_hi])
    model.cfg = replace(
        cfg, num_heads=(g_hi - g_lo) * per_group, num_kv_heads=g_hi - g_lo, intermediate_size=i_hi - i_lo
    )
    if model.packed_lm_head is not None:  # the full model was prepacked by the loader: pack the shard
        model.prepack()
    return model
