"""One replica's hardware and model: a model spec on `tp` GPUs of one device, weight and KV dtypes.
It checks that the configuration can run and plans its KV blocks the way the live engine does."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.memory import MemoryPlan, activation_bytes, plan_budget
from engine.model.llama import LlamaConfig
from engine.sim import constants as C
from engine.sim.devices import Device
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

    def __post_init__(self) -> None:
        m, d = self.model, self.device
        if self.dtype not in WEIGHT_DTYPES:
            raise SimConfigError(f"dtype {self.dtype!r}: choose one of {', '.join(WEIGHT_DTYPES)}")
        if self.kv_dtype not in KV_DTYPES:
            raise SimConfigError(f"kv dtype {self.kv_dtype!r}: choose one of {', '.join(KV_DTYPES)}")
        if not d.supports(self.dtype):
            raise SimConfigError(f"{self.dtype} needs FP4 tensor cores: only b200 has them, not {d.name}")
        if self.tp < 1 or m.cfg.num_kv_heads % self.tp or m.cfg.num_heads % self.tp:
            raise SimConfigError(
                f"tensor parallel {self.tp} must divide {m.name}'s {m.cfg.num_kv_heads} KV heads "
                f"and {m.cfg.num_heads} query heads"
            )
        if self.weight_bytes + self.tp * self.reserve_bytes > self.tp * d.memory_bytes:
            raise SimConfigError(
                f"{m.name} in {self.dtype} needs {self.weight_bytes / 1e9:.0f} GB of weights; "
                f"{self.tp} x {d.name} hold {self.tp * d.memory_gb:.0f} GB: use fp8 or more GPUs"
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
    def reserve_bytes(self) -> int:
        """Per GPU: the runtime's reserve, plus NCCL buffers with tensor parallelism."""
        return self.device.runtime_reserve_bytes + (C.NCCL_BUFFER_BYTES if self.tp > 1 else 0)

    @property
    def shard_cfg(self) -> LlamaConfig:
        """One GPU's shard of the model's shape (heads and FFN split by TP), as the live engine's
        ranks hold it."""
        c, t = self.model.cfg, self.tp
        return dataclasses.replace(
            c, num_heads=c.num_heads // t, num_kv_heads=c.num_kv_heads // t, intermediate_size=c.intermediate_size // t
        )

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token on one GPU (its KV heads only)."""
        return self.shard_cfg.kv_bytes_per_token * C.DTYPE_BYTES[self.kv_dtype]

    def plan_memory(self, config: EngineConfig, free_fraction: float | None = None) -> MemoryPlan:
        """Per GPU: free_fraction * (memory - weights/TP - activations - runtime reserve) -> KV
        blocks, through the live engine's own plan_budget."""
        cfg = self.shard_cfg
        weights = self.weight_bytes // self.tp
        d = self.device
        acts = activation_bytes(config, cfg, d.activation_bytes)
        fraction = d.kv_free_fraction if free_fraction is None else free_fraction
        return plan_budget(
            config, cfg, weights, weights, C.DTYPE_BYTES[self.kv_dtype], d.memory_bytes, acts, self.reserve_bytes, fraction
        )
