"""How much of a GPU the KV cache gets (vLLM's gpu_memory_utilization rule): the replica may use
`gpu_memory_utilization` of the card in all; what other processes and this one's CUDA context hold
when it starts, the weights, the peak of one profiled widest step and what the CUDA runtime took
outside torch's allocator (cuBLAS, NCCL, kernel modules) are measured and taken off; the KV cache
gets the rest. memory_cap_mb is the CPU's rule (engine/core/memory.py); an estimate of a GPU's
overheads near the card's size ends in a raw out-of-memory, a measurement does not.

The sizing itself (plan_cuda_kv) reads a CudaMemoryReading, so a test can hand it any card."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.config import EngineConfig
from engine.core.block_manager import blocks_for
from engine.core.memory import MB, MemoryPlan, activation_bytes, plan_budget, weight_footprint
from engine.core.scheduler import SchedulerOutput
from engine.core.sequence import RequestTimes, Sequence
from engine.model.llama import Llama
from engine.sampling_params import SamplingParams

GB = 1024**3
log = logging.getLogger("servelab.engine")


class CudaMemoryProbe(Protocol):
    """What the sizing reads off the card (torch.cuda's calls; a test stubs them)."""

    def mem_get_info(self) -> tuple[int, int]: ...  # (free, total) bytes on the card, every process

    def max_memory_allocated(self) -> int: ...  # torch's allocator, this process, since reset

    def max_memory_reserved(self) -> int: ...

    def memory_reserved(self) -> int: ...

    def reset_peak(self) -> None: ...


class TorchCudaProbe:
    def __init__(self, device: str) -> None:
        self.device = torch.device(device)

    def mem_get_info(self) -> tuple[int, int]:
        return torch.cuda.mem_get_info(self.device)

    def max_memory_allocated(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def max_memory_reserved(self) -> int:
        return torch.cuda.max_memory_reserved(self.device)

    def memory_reserved(self) -> int:
        return torch.cuda.memory_reserved(self.device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)


@dataclass(frozen=True)
class CudaMemoryReading:
    total: int  # the card's memory
    used_at_start: int  # held before this engine loaded: other processes, this one's CUDA context
    weights: int  # torch's allocation once the weights were in place
    peak: int  # torch's allocation at the widest profiled step's peak (weights included)
    allocator_slack: int  # reserved by torch's caching allocator beyond its peak allocation
    outside_torch: int  # grew outside torch's allocator meanwhile (cuBLAS, NCCL, modules)

    @property
    def activations(self) -> int:
        return max(self.peak - self.weights, 0)

    @property
    def reserve(self) -> int:
        return self.used_at_start + self.allocator_slack + self.outside_torch


def start_reading(probe: CudaMemoryProbe) -> tuple[int, int]:
    """(used, total) before the engine loads anything: what is not ours to plan with."""
    free, total = probe.mem_get_info()
    probe.reset_peak()
    return total - free, total


def finish_reading(probe: CudaMemoryProbe, start: tuple[int, int], weights: int) -> CudaMemoryReading:
    """After loading and profiling: the peak, and what the card lost outside torch's allocator."""
    used_at_start, total = start
    free, _ = probe.mem_get_info()
    peak, peak_reserved = probe.max_memory_allocated(), probe.max_memory_reserved()
    outside = (total - free) - used_at_start - probe.memory_reserved()
    return CudaMemoryReading(total, used_at_start, weights, peak, max(peak_reserved - peak, 0), max(outside, 0))


def plan_cuda_kv(
    config: EngineConfig, model: Llama, kv_elem_bytes: float, reading: CudaMemoryReading
) -> MemoryPlan:
    """The KV plan on a card: gpu_memory_utilization of it, less everything measured."""
    weight_bytes, param_bytes = weight_footprint(model)
    cap = int(config.gpu_memory_utilization * reading.total)
    if config.kv_budget_mb is None and cap - reading.reserve - weight_bytes - reading.activations < 1:
        raise_no_room(config, reading, weight_bytes)
    return plan_budget(
        config, model.cfg, weight_bytes, param_bytes, kv_elem_bytes, cap, reading.activations, reading.reserve,
        cap_field="gpu_memory_utilization",
    )


def raise_no_room(config: EngineConfig, reading: CudaMemoryReading, weight_bytes: int) -> None:
    from engine.errors import InvalidParamError

    raise InvalidParamError(
        "gpu_memory_utilization",
        f"{config.gpu_memory_utilization:g} of {reading.total / GB:.1f} GiB leaves no room for the KV cache: "
        f"{reading.used_at_start / GB:.2f} GiB were in use before this engine started (other processes, "
        f"the CUDA context), the weights take {weight_bytes / GB:.2f} GiB, the widest step "
        f"{reading.activations / GB:.2f} GiB and the runtime {reading.outside_torch / GB:.2f} GiB",
    )


def profile_widest_step(model: Llama, config: EngineConfig, kv_dtype: torch.dtype, device: str) -> int:
    """One forward of the widest step the scheduler may build (max_batched_tokens over up to
    max_num_seqs sequences, every one sampled) on a scratch KV cache just big enough, so that
    torch's peak counts its activations and logits; the scratch cache is freed after. Returns
    the scratch cache's bytes: in the peak, and no activation."""
    from engine.worker.runner import ModelRunner  # the runner's own tensors and sampling: the real peak

    tokens = config.max_batched_tokens
    num_seqs = max(1, min(config.max_num_seqs, tokens))
    lengths = [tokens // num_seqs + (i < tokens % num_seqs) for i in range(num_seqs)]
    lengths = [n for n in lengths if n]
    bs = config.block_size
    runner = ModelRunner(model, sum(blocks_for(n, bs) for n in lengths), bs, kv_dtype, device)
    batch, next_block = SchedulerOutput(), 0
    for i, n in enumerate(lengths):
        ids = [1 + j % (model.cfg.vocab_size - 1) for j in range(n)]
        seq = Sequence(f"__profile_{i}__", ids, SamplingParams(temperature=0), RequestTimes(0.0))
        seq.block_table = list(range(next_block, next_block + blocks_for(n, bs)))
        next_block += len(seq.block_table)
        batch.seqs.append(seq)
        batch.num_new_tokens.append(n)
    scratch = sum(t.untyped_storage().nbytes() for pair in runner.kv_caches for t in pair)
    runner.execute(batch)
    del runner
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return scratch


def plan_on_card(
    config: EngineConfig, model: Llama, kv_dtype: torch.dtype, probe: TorchCudaProbe, start: tuple[int, int],
    profile: bool,
) -> MemoryPlan:
    """The KV plan from what the card says (engine/worker/gpu_memory.py). One rank profiles its widest
    step; a rank of several cannot before the group forms (its forward all-reduces), so it counts
    the activations as the CPU plan estimates them."""
    weights = torch.cuda.memory_allocated(config.device)
    scratch = profile_widest_step(model, config, kv_dtype, config.device) if profile else 0
    reading = finish_reading(probe, start, weights)
    if profile:
        peak = reading.peak - scratch  # the profile's own KV is no activation
    else:
        peak = weights + activation_bytes(config, model.cfg, torch.finfo(model.embed.dtype).bits // 8)
    reading = dataclasses.replace(reading, peak=peak)
    log.info("memory on %s: %s", config.device, describe(reading, config.gpu_memory_utilization))
    return plan_cuda_kv(config, model, torch.finfo(kv_dtype).bits // 8, reading)


def describe(reading: CudaMemoryReading, utilisation: float) -> str:
    return (
        f"card {reading.total / MB:.0f} MB x {utilisation:g}; in use at start {reading.used_at_start / MB:.0f} MB, "
        f"weights {reading.weights / MB:.0f} MB, widest step {reading.activations / MB:.0f} MB, "
        f"runtime {reading.outside_torch / MB:.0f} MB"
    )
