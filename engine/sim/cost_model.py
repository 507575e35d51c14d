"""A step's time from physics, for the tokens the real scheduler chose.

Per GPU of a TP group, for one step:
- GEMMs: 2 FLOPs per weight per token (the LM head only for sampled rows), against the weight
  bytes read once per step; a roofline max of the two at achieved compute and bandwidth.
- attention: prefill chunks are compute (QK^T and PV over their context), decodes are KV bytes
  read; each at its own roofline.
- elementwise kernels (norms, RoPE, SwiGLU): activation bytes per token at achieved bandwidth.
- TP: two all-reduces per layer of the step's activations, latency + ring bytes / link bandwidth.
- host: per-step overhead, per-layer kernel launches, one sampling kernel, and per sampled row
  (the CPU device's Python per sequence; 0 on GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.sim import constants as C
from engine.sim.deployment import Deployment


@dataclass(frozen=True)
class StepShape:
    """What the scheduler chose, reduced to the sums the cost model needs."""

    num_tokens: int  # new tokens of every sequence this step
    num_sampled: int  # rows that produce a token (their last known token was computed)
    num_decodes: int = 0
    decode_context: int = 0  # sum over decodes of the tokens attended (context + 1)
    prefill_attention: float = 0.0  # sum over prefill chunks of n * (context + (n + 1) / 2)
    prefill_context: int = 0  # sum over prefill chunks of the context already cached (KV read)


@dataclass(frozen=True)
class StepCost:
    gemm_s: float
    elementwise_s: float
    attention_s: float
    allreduce_s: float
    overhead_s: float
    sample_s: float

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.elementwise_s + self.attention_s + self.allreduce_s + self.overhead_s + self.sample_s


class CostModel:
    def __init__(self, dep: Deployment) -> None:
        self.dep = dep
        m, d, t = dep.model, dep.device, dep.tp
        cfg = m.cfg
        wbytes = C.DTYPE_BYTES[dep.dtype]
        head_bytes = wbytes if dep.dtype == "bf16" else C.EMBED_BYTES
        self.linear_params = m.linear_params / t
        self.head_params = m.head_params / t
        self.weight_read_bytes = self.linear_params * wbytes + self.head_params * head_bytes
        self.gemm_flops = d.gemm_flops(dep.dtype)
        self.gemm_overlaps_memory = d.gemm_overlaps_memory
        self.attn_flops = d.attention_flops
        self.bandwidth = d.bandwidth
        # Attention FLOPs per (query token x attended token): QK^T and PV, 2 FLOPs a multiply-add,
        # over this GPU's heads in every layer.
        self.attn_flops_per_pair = 4 * (cfg.num_heads // t) * cfg.head_dim * cfg.num_layers
        self.kv_bytes_per_token = dep.kv_bytes_per_token
        q, kv = cfg.num_heads // t * cfg.head_dim, cfg.num_kv_heads // t * cfg.head_dim
        elements = C.ELEMENTWISE_HIDDEN * cfg.hidden_size + C.ELEMENTWISE_QK * (q + kv)
        elements += C.ELEMENTWISE_FFN * cfg.intermediate_size // t
        self.elementwise_s_per_token = elements * C.ACTIVATION_BYTES * cfg.num_layers / self.bandwidth
        self.fixed_s = d.step_overhead_s + cfg.num_layers * d.layer_overhead_s
        self.vocab = cfg.vocab_size
        self.num_allreduces = C.ALLREDUCES_PER_LAYER * cfg.num_layers if t > 1 else 0
        self.allreduce_latency = d.allreduce_latency_s
        # Ring all-reduce moves 2(t-1)/t of the buffer over each GPU's link; beyond one node the
        # slowest hop is the fabric.
        link = d.link_bw if t <= d.gpus_per_node else C.INTER_NODE_BW
        self.allreduce_s_per_byte = 2 * (t - 1) / t / (link * d.link_efficiency) if t > 1 else 0.0
        self.activation_row_bytes = cfg.hidden_size * C.ACTIVATION_BYTES
        self.sample_overhead = d.sample_overhead_s
        self.token_overhead = d.token_overhead_s

    def step(self, s: StepShape) -> StepCost:
        if s.num_tokens == 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        flops = 2 * (s.num_tokens * self.linear_params + s.num_sampled * self.head_params)
        compute, weights = flops / self.gemm_flops, self.weight_read_bytes / self.bandwidth
        gemm = max(compute, weights) if self.gemm_overlaps_memory else compute + weights
        kvb = self.kv_bytes_per_token
        prefill_tokens = s.num_tokens - s.num_decodes
        prefill = 0.0
        if prefill_tokens:
            prefill = max(
                s.prefill_attention * self.attn_flops_per_pair / self.attn_flops,
                (s.prefill_context + prefill_tokens) * kvb / self.bandwidth,
            )
        decode = 0.0
        if s.num_decodes:
            decode = max(
                s.decode_context * self.attn_flops_per_pair / self.attn_flops, s.decode_context * kvb / self.bandwidth
            )
        allreduce = self.num_allreduces * (
            self.allreduce_latency + s.num_tokens * self.activation_row_bytes * self.allreduce_s_per_byte
        )
        # Sampling reads the float32 logits of each sampled row; the host handles each row too.
        row = self.vocab * 4 / self.bandwidth + self.token_overhead
        sample = self.sample_overhead + s.num_sampled * row if s.num_sampled else 0.0
        elementwise = s.num_tokens * self.elementwise_s_per_token
        return StepCost(gemm, elementwise, prefill + decode, allreduce, self.fixed_s, sample)
