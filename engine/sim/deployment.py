"""One replica's hardware and model: a model spec on `tp` x `pp` GPUs of one device (TP shards
every layer; PP splits the layers into contiguous stages, one TP group each), weight and KV dtypes.
It checks that the configuration can run and plans its KV blocks the way the live engine does:
each stage holds the KV of its own layers, and the replica has the blocks its fullest stage holds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.core.memory import MemoryPlan, activation_bytes, plan_budget
from engine.model.llama_config import LlamaConfig
from engine.model.partition import stage_layers
from engine.sim import constants as C
from engine.sim.devices import Device
from engine.sim.host_profiles import HOST_PROFILES
from engine.sim.models import ModelSpec

WEIGHT_DTYPES = ("bf16", "fp8", "fp4")
KV_DTYPES = ("bf16", "fp8")


class SimConfigError(ValueError):
    """A configuration that cannot run; the message says why (the CLI prints it and exits 2)."""


@dataclass(frozen=True)
class Deployment:
    model: ModelSpec
    device: Device
    tp: int = 1
    dtype: str = "bf16"
    kv_dtype: str = "bf16"
    pp: int = 1
    host: str = "default"  # the engine's host profile (engine/sim/host_profiles.py)
    # Speculative decoding's chance that a guess stands, given those before it did: what the drafter
    # achieves on this traffic (used only where the engine speculates: num_speculative_tokens).
    spec_acceptance: float = 0.0
    # A draft pass's time over the target's step (Leviathan et al.'s c): 0 for n-gram lookup.
    spec_draft_cost: float = 0.0

    def __post_init__(self) -> None:
        m, d = self.model, self.device
        if self.dtype not in WEIGHT_DTYPES:
            raise SimConfigError(f"dtype {self.dtype!r}: choose one of {', '.join(WEIGHT_DTYPES)}")
        if self.host not in HOST_PROFILES:
            raise SimConfigError(f"host profile {self.host!r}: choose one of {', '.join(HOST_PROFILES)}")
        if not 0 <= self.spec_acceptance <= 1:
            raise SimConfigError(f"spec acceptance {self.spec_acceptance:g} must be from 0 to 1")
        if not 0 <= self.spec_draft_cost <= 1:
            raise SimConfigError(f"spec draft cost {self.spec_draft_cost:g} must be from 0 to 1 (of a target step)")
        if self.kv_dtype not in KV_DTYPES:
            raise SimConfigError(f"kv dtype {self.kv_dtype!r}: choose one of {', '.join(KV_DTYPES)}")
        if not d.supports(self.dtype):
            raise SimConfigError(f"{self.dtype} needs FP4 tensor cores: only b200 has them, not {d.name}")
        kv_heads = m.cfg.num_kv_heads
        # Beyond the KV heads, each is replicated on tp / kv_heads ranks (as vLLM does).
        if self.tp < 1 or m.cfg.num_heads % self.tp or (kv_heads % self.tp and self.tp % kv_heads):
            raise SimConfigError(
                f"tensor parallel {self.tp} must divide {m.name}'s {m.cfg.num_heads} query heads and divide, or be "
                f"a multiple of, its {kv_heads} KV heads; to spread a replica over more GPUs, split its layers "
                "into pipeline stages (--pp)"
            )
        if not 1 <= self.pp <= m.cfg.num_layers:
            raise SimConfigError(f"pipeline parallel {self.pp} must be from 1 to {m.name}'s {m.cfg.num_layers} layers")
        if self.fullest_stage_bytes + self.tp * self.reserve_bytes > self.tp * d.memory_bytes:
            gpus = self.tp * self.pp
            raise SimConfigError(
                f"{m.name} in {self.dtype} needs {self.weight_bytes / 1e9:.0f} GB of weights; "
                f"{gpus} x {d.name} hold {gpus * d.memory_gb:.0f} GB: use fp8, or more GPUs a replica "
                "(--tp inside a node, pipeline stages with --pp across nodes)"
                + (f" (each GPU also keeps {self.reserve_bytes / 1e9:.1f} GB for the runtime)" if self.reserve_bytes else "")
            )

    @property
    def weight_bytes(self) -> int:
        """Every weight once, all GPUs together; embeddings and LM head stay bf16 when quantized."""
        m = self.model
        embeds = m.embed_params + (0 if m.cfg.tie_word_embeddings else m.head_params)
        wbytes = C.DTYPE_BYTES[self.dtype]
        embed_bytes = wbytes if self.dtype == "bf16" else C.EMBED_BYTES
        return int(m.linear_params * wbytes + embeds * embed_bytes)

    @property
    def stage_layers(self) -> list[int]:
        return stage_layers(self.model.cfg.num_layers, self.pp)

    def stage_weight_bytes(self, stage: int) -> int:
        """One stage's weights, its TP group together: its layers, the embeddings on the first, the
        LM head on the last (its own copy when tied to the embeddings and the stages are two GPUs)."""
        m, layers = self.model, self.stage_layers
        wbytes = C.DTYPE_BYTES[self.dtype]
        embed_bytes = wbytes if self.dtype == "bf16" else C.EMBED_BYTES
        embeds = m.embed_params if stage == 0 else 0
        if stage == self.pp - 1 and (self.pp > 1 or not m.cfg.tie_word_embeddings):
            embeds += m.head_params
        return int(layers[stage] * m.layer_params * wbytes + embeds * embed_bytes)

    @property
    def fullest_stage_bytes(self) -> int:
        """The heaviest stage's weights, its TP group together (every weight without PP)."""
        return max(self.stage_weight_bytes(i) for i in range(self.pp))

    @property
    def gpu_weight_bytes(self) -> int:
        """The most weight bytes one GPU holds (the slowest to load, the least room for KV)."""
        return self.fullest_stage_bytes // self.tp

    @property
    def reserve_bytes(self) -> int:
        """Per GPU: the runtime's reserve, plus NCCL buffers with tensor or pipeline parallelism."""
        return self.device.runtime_reserve_bytes + (C.NCCL_BUFFER_BYTES if self.tp * self.pp > 1 else 0)

    @property
    def shard_cfg(self) -> LlamaConfig:
        """One GPU's shard of the model's shape (heads and FFN split by TP), as the live engine's
        ranks hold it."""
        c, t = self.model.cfg, self.tp
        return dataclasses.replace(
            c, num_heads=c.num_heads // t, num_kv_heads=max(1, c.num_kv_heads // t), intermediate_size=c.intermediate_size // t
        )

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token in every layer, on one TP rank (its KV heads only)."""
        return self.shard_cfg.kv_bytes_per_token * C.DTYPE_BYTES[self.kv_dtype]

    @property
    def stage_kv_bytes_per_token(self) -> float:
        """K and V of one token on one GPU of the fullest stage (its layers and KV heads only)."""
        return self.kv_bytes_per_token * max(self.stage_layers) / self.model.cfg.num_layers

    def plan_memory(self, config: EngineConfig, free_fraction: float | None = None) -> MemoryPlan:
        """Per GPU: free_fraction * (memory - weights/TP - activations - runtime reserve) -> KV
        blocks, through the live engine's own plan_budget; with stages, each stage's GPUs plan for
        their own layers and weights, and the replica has the fewest blocks any stage holds."""
        d = self.device
        fraction = d.kv_free_fraction if free_fraction is None else free_fraction
        plans = []
        for stage, layers in enumerate(self.stage_layers):
            cfg = self.shard_cfg if self.pp == 1 else dataclasses.replace(self.shard_cfg, num_layers=layers)
            weights = self.stage_weight_bytes(stage) // self.tp
            acts = activation_bytes(config, cfg, d.activation_bytes)
            plans.append(plan_budget(
                config, cfg, weights, weights, C.DTYPE_BYTES[self.kv_dtype], d.memory_bytes, acts, self.reserve_bytes,
                fraction,
            ))  # fmt: skip
        return min(plans, key=lambda plan: plan.num_blocks)
