"""The decode roofline for this machine: how fast one batch-64 decode step could possibly be,
from a measured read bandwidth and a measured matmul rate in the engine's dtype."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.model.llama import LlamaConfig


def _best_of(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_read_bandwidth(num_bytes: int = 512 * 2**20) -> float:
    """Bytes/s of a streaming read (a sum over a buffer far larger than the caches)."""
    buf = torch.ones(num_bytes // 4, dtype=torch.float32)
    return num_bytes / _best_of(lambda: buf.sum())


def measure_matmul_rate(m: int = 64, n: int = 4096, k: int = 4096, dtype: torch.dtype = torch.bfloat16) -> float:
    """FLOP/s of a decode-shaped matmul (batch rows x a weight matrix) in dtype."""
    a = torch.randn(m, k, dtype=dtype)
    b = torch.randn(n, k, dtype=dtype)
    return 2 * m * n * k / _best_of(lambda: torch.nn.functional.linear(a, b))


def measure_bf16_matmul_rate(m: int = 64, n: int = 4096, k: int = 4096) -> float:
    return measure_matmul_rate(m, n, k, torch.bfloat16)


@dataclass
class Roofline:
    weight_bytes: int
    kv_bytes: int
    flops: float
    read_bandwidth: float
    matmul_rate: float

    @property
    def memory_s(self) -> float:
        return (self.weight_bytes + self.kv_bytes) / self.read_bandwidth

    @property
    def compute_s(self) -> float:
        return self.flops / self.matmul_rate

    @property
    def step_s(self) -> float:
        return max(self.memory_s, self.compute_s)


def decode_roofline(cfg: LlamaConfig, batch: int, mean_context: float, dtype_bytes: int = 2) -> Roofline:
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    layer_params = hidden * (q_size + 2 * kv_size) + q_size * hidden + 3 * hidden * inter
    matmul_params = cfg.num_layers * layer_params + cfg.vocab_size * hidden  # + LM head
    weight_bytes = matmul_params * dtype_bytes
    kv_bytes = int(batch * mean_context * cfg.kv_bytes_per_token * dtype_bytes)
    attention_flops = 4 * batch * mean_context * cfg.num_heads * cfg.head_dim * cfg.num_layers
    flops = 2 * batch * matmul_params + attention_flops
    dtype = torch.float32 if dtype_bytes == 4 else torch.bfloat16
    return Roofline(weight_bytes, kv_bytes, flops, measure_read_bandwidth(), measure_matmul_rate(dtype=dtype))
