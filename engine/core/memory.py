"""How many KV blocks a replica gets: the KV budget is what the device's memory cap leaves after
the weights and the activations of the largest step, unless kv_budget_mb names it outright.

The plan itself (plan_budget, activation_bytes) is torch-free: the simulator plans with it in the
web process. Only what reads a loaded model or a device (plan_kv_blocks, copy_bandwidth_gbs)
imports torch, when called."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.errors import InvalidParamError
from engine.model.llama_config import LlamaConfig

if TYPE_CHECKING:
    import torch

    from engine.model.llama import Llama

MB = 1024 * 1024


@dataclass
class MemoryPlan:
    cap_bytes: int
    weight_bytes: int  # what the weights occupy, prepacked copies included
    param_bytes: int  # the parameters once each: what a decode step must read
    activation_bytes: int
    kv_budget_bytes: int
    bytes_per_block: int
    block_size: int
    num_blocks: int
    reserve_bytes: int = 0  # runtime and collective buffers a GPU keeps (simulated devices)

    @property
    def num_kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def describe(self) -> str:
        return (
            f"KV budget {self.kv_budget_bytes / MB:.0f} MB (cap {self.cap_bytes / MB:.0f} MB - weights "
            f"{self.weight_bytes / MB:.0f} MB - activations {self.activation_bytes / MB:.0f} MB"
            + (f" - reserve {self.reserve_bytes / MB:.0f} MB" if self.reserve_bytes else "")
            + f"): {self.num_blocks} blocks of {self.block_size} tokens = {self.num_kv_tokens} tokens"
        )


def weight_footprint(model: Llama) -> tuple[int, int]:
    """(bytes the weights occupy, prepacked copies included; the parameters once each, int8
    weights in place of the ones they replace)."""
    unique = {id(p): p for p in model.parameters()}.values()  # the tied head counts once
    param_bytes = sum(p.numel() * p.element_size() for p in unique) + model.int8_bytes()
    return param_bytes + model.packed_bytes(), param_bytes


def activation_bytes(config: EngineConfig, cfg: LlamaConfig, elem: float = 4) -> int:
    """Widest per-token activations of one layer (qkv, gate/up, SwiGLU product, residuals) for a
    full token budget, plus the logits of every sampled row (float32); elem is the activations'
    element size (the live CPU engine plans float32 to be safe)."""
    per_token = elem * (
        3 * cfg.hidden_size + (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim + 3 * cfg.intermediate_size
    )
    return int(config.max_batched_tokens * per_token + 2 * config.max_num_seqs * cfg.vocab_size * 4)


def plan_budget(
    config: EngineConfig,
    cfg: LlamaConfig,
    weight_bytes: int,
    param_bytes: int,
    kv_elem_bytes: float,
    cap: int,
    activations: int,
    reserve_bytes: int = 0,
    free_fraction: float = 1.0,
    cap_field: str = "memory_cap_mb",
) -> MemoryPlan:
    """The one KV plan, live and simulated: budget = free_fraction * (cap - weights - activations -
    reserve) unless kv_budget_mb names it; cfg is this rank's shard (its KV heads only); cap_field:
    the setting a plan without room names (a GPU's is gpu_memory_utilization)."""
    if config.kv_budget_mb is not None:
        budget = int(config.kv_budget_mb * MB)
    else:
        budget = int(free_fraction * (cap - weight_bytes - activations - reserve_bytes))
    bytes_per_block = int(cfg.kv_bytes_per_token * kv_elem_bytes * config.block_size)
    num_blocks = budget // bytes_per_block
    if num_blocks < 1:
        raise InvalidParamError(
            "kv_budget_mb" if config.kv_budget_mb is not None else cap_field,
            f"leaves no room for one KV block of {bytes_per_block} bytes",
        )
    return MemoryPlan(
        cap, weight_bytes, param_bytes, activations, budget, bytes_per_block, config.block_size, num_blocks, reserve_bytes
    )


def plan_kv_blocks(config: EngineConfig, model: Llama, kv_dtype: torch.dtype) -> MemoryPlan:
    """model.cfg is this rank's shard under tensor parallelism: its weights and KV heads only;
    kv_dtype the cache's element type."""
    import torch

    cfg = model.cfg
    weight_bytes, param_bytes = weight_footprint(model)
    cap = int(config.memory_cap_mb * MB)
    elem = torch.finfo(kv_dtype).bits // 8
    return plan_budget(config, cfg, weight_bytes, param_bytes, elem, cap, activation_bytes(config, cfg))


def copy_bandwidth_gbs(device: str = "cpu", num_bytes: int = 64 * MB, repeats: int = 5) -> float:
    """Measured device memory bandwidth (GB/s, read + write) of a plain copy: the roofline's
    denominator, since a decode step must stream every weight once."""
    import time

    import torch

    src = torch.empty(num_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * num_bytes / best / 1e9
