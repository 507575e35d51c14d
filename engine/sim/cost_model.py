"""A step's time from physics, for the tokens the real scheduler chose.

Per GPU of a TP group, for one step:
- GEMMs: 2 FLOPs per weight per token (the LM head only for sampled rows), against the weight
  bytes read once per step; a roofline max of the two at achieved compute (NVFP4's own, lower
  share of its peak) and bandwidth.
- attention: prefill chunks are compute (QK^T and PV over their context), decodes are KV bytes
  read; each at its own roofline (the math in FP8 over an FP8 cache on Hopper and Blackwell).
- elementwise kernels (norms, RoPE, SwiGLU): activation bytes per token at achieved bandwidth.
- TP: two all-reduces per layer of the step's activations, latency + ring bytes / link bandwidth.
- host: per-step overhead, per-layer kernel launches, one sampling kernel, and per sampled row
  (the CPU device's Python per sequence; 0 on GPUs). A named engine profile
  (engine/sim/host_profiles.py: Vidur's measured schedule, sampler, prepare and process-outputs
  costs by batch and TP) replaces the fixed step overhead, paid serially, once per multi-step
  run, or hidden behind the GPU's step unless longer.
- PP: each stage prices its own layers (stage_layers); the first also schedules, the last also
  runs the LM head and samples, and each but the last sends the step's activations (hidden state
  and residual, as vLLM's IntermediateTensors) to the next over the link that joins them.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.sim import constants as C
from engine.sim.deployment import Deployment
from engine.sim.host_profiles import PROFILES, HostMode


@dataclass(frozen=True)
class StepShape:
    """What the scheduler chose, reduced to the sums the cost model needs."""

    num_tokens: int  # new tokens of every sequence this step
    num_sampled: int  # rows that produce a token (their last known token was computed)
    num_decodes: int = 0
    decode_context: int = 0  # sum over decodes of the tokens attended (context + 1)
    prefill_attention: float = 0.0  # sum over prefill chunks of n * (context + (n + 1) / 2)
    prefill_context: int = 0  # sum over prefill chunks of the context already cached (KV read)
    num_seqs: int = 0  # sequences in the batch (the host's per-sequence work: engine/sim/host_profiles.py)
    scheduled: bool = True  # False: a later step of a multi-step run (no schedule, no input preparation)


@dataclass(frozen=True)
class StepCost:
    gemm_s: float
    elementwise_s: float
    attention_s: float
    allreduce_s: float
    overhead_s: float
    sample_s: float
    transfer_s: float = 0.0  # a pipeline stage's send of the activations to the next stage
    # Of overhead_s, the host's part on the step's critical path: the fixed step overhead or a host
    # profile's serial stages plus what of its hidden ones outlasts the GPU's step. Kernel launches
    # and the per-row sampling cost count with the model (the live engine times sampling so too).
    host_s: float = 0.0

    @property
    def compute_s(self) -> float:
        """The time the stage's GPUs are busy (the send overlaps the next batch's work)."""
        return self.gemm_s + self.elementwise_s + self.attention_s + self.allreduce_s + self.overhead_s + self.sample_s

    @property
    def total_s(self) -> float:
        return self.compute_s + self.transfer_s


ZERO_COST = StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def summed(stages: list[StepCost]) -> StepCost:
    """A batch's whole time through the stages, one after another, field by field."""
    if len(stages) == 1:
        return stages[0]
    return StepCost(*(sum(getattr(c, f) for c in stages) for f in StepCost.__dataclass_fields__))


class CostModel:
    def __init__(self, dep: Deployment) -> None:
        self.dep = dep
        m, d, t = dep.model, dep.device, dep.tp
        cfg = m.cfg
        wbytes = C.DTYPE_BYTES[dep.dtype]
        head_bytes = wbytes if dep.dtype == "bf16" else C.EMBED_BYTES
        self.linear_params = m.linear_params / t
        self.head_params = m.head_params / t
        self.linear_bytes, self.head_bytes = self.linear_params * wbytes, self.head_params * head_bytes
        self.weight_read_bytes = self.linear_bytes + self.head_bytes  # every stage's, together
        # Each stage's share of the layers (1.0 for the one stage without PP).
        self.layers = dep.stage_layers
        self.shares = [n / cfg.num_layers for n in self.layers]
        self.gemm_flops = d.gemm_flops(dep.dtype)
        self.gemm_overlaps_memory = d.gemm_overlaps_memory
        self.attn_flops = d.attention_flops(dep.kv_dtype)
        self.bandwidth = d.bandwidth
        # Attention FLOPs per (query token x attended token): QK^T and PV, 2 FLOPs a multiply-add,
        # over this GPU's heads in every layer.
        self.attn_flops_per_pair = 4 * (cfg.num_heads // t) * cfg.head_dim * cfg.num_layers
        self.kv_bytes_per_token = dep.kv_bytes_per_token
        shard = dep.shard_cfg  # one rank's heads (a KV head replicated where TP exceeds them)
        q, kv = shard.num_heads * cfg.head_dim, shard.num_kv_heads * cfg.head_dim
        elements = C.ELEMENTWISE_HIDDEN * cfg.hidden_size + C.ELEMENTWISE_QK * (q + kv)
        elements += C.ELEMENTWISE_FFN * cfg.intermediate_size // t
        self.elementwise_s_per_token = elements * C.ACTIVATION_BYTES * cfg.num_layers / self.bandwidth
        self.step_overhead_s, self.layer_overhead_s = d.step_overhead_s, d.layer_overhead_s
        self.host = PROFILES[dep.host]
        if self.host.mode is not HostMode.DEFAULT:
            self.step_overhead_s = 0.0  # the profile's measured stages stand for it
        self.tp = t
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
        # A stage hands the next its hidden state and residual, each TP rank to its peer; once the
        # replica spans nodes (TP x PP beyond a node) that hop is the fabric.
        stage_link = d.link_bw if t * dep.pp <= d.gpus_per_node else C.INTER_NODE_BW
        staged = dep.pp > 1  # (a device without a link, the CPU, has one stage)
        self.transfer_s_per_token = 2 * self.activation_row_bytes / (stage_link * d.link_efficiency) if staged else 0.0
        self.transfer_latency = d.allreduce_latency_s  # one NCCL send/recv, as one small collective

    def step(self, s: StepShape) -> StepCost:
        """The batch's time through the replica: its one stage, or every stage in turn."""
        return summed(self.stages(s))

    def stages(self, s: StepShape) -> list[StepCost]:
        """Each pipeline stage's part of the step, first to last."""
        if s.num_tokens == 0:
            return [ZERO_COST] * len(self.layers)
        last = len(self.layers) - 1
        return [self._stage(s, i, i == last) for i in range(len(self.layers))]

    def _stage(self, s: StepShape, i: int, last: bool) -> StepCost:
        share = self.shares[i]
        sampled = s.num_sampled if last else 0  # the LM head and sampling run on the last stage
        flops = 2 * (s.num_tokens * self.linear_params * share + sampled * self.head_params)
        read = self.linear_bytes * share + (self.head_bytes if last else 0.0)
        compute, weights = flops / self.gemm_flops, read / self.bandwidth
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
        allreduce = self.num_allreduces * share * (
            self.allreduce_latency + s.num_tokens * self.activation_row_bytes * self.allreduce_s_per_byte
        )
        # Sampling reads the float32 logits of each sampled row; the host handles each row too.
        row = self.vocab * 4 / self.bandwidth + self.token_overhead
        sample = self.sample_overhead + sampled * row if sampled else 0.0
        elementwise = s.num_tokens * self.elementwise_s_per_token * share
        # The first stage schedules the step; every stage launches its layers' kernels.
        host = self.step_overhead_s if i == 0 else 0.0
        fixed = host + self.layers[i] * self.layer_overhead_s
        attention = (prefill + decode) * share
        if i == 0 and self.host.mode is not HostMode.DEFAULT:
            profile = self.host.cost(s.num_seqs, self.tp, s.scheduled)
            busy = gemm + elementwise + attention + allreduce + sample + fixed
            visible = profile.serial_s + max(0.0, profile.hidden_s - busy)  # hidden work adds only its excess
            host, fixed = host + visible, fixed + visible
        transfer = 0.0 if last else self.transfer_latency + s.num_tokens * self.transfer_s_per_token
        return StepCost(gemm, elementwise, attention, allreduce, fixed, sample, transfer, host)
