"""EngineConfig: every lever that shapes one engine replica, typed and validated in one place."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidParamError

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
# "auto": bf16 where the device multiplies it natively, else fp32 (engine/platform/machine.py decides).
DTYPES = ("auto", "float32", "bfloat16", "float16")
# How the scheduler admits against KV memory. "greedy" (vLLM): a prompt's blocks are enough, and
# when decodes outgrow the cache the newest sequence is preempted and recomputed. "reserve"
# (TensorRT-LLM's GUARANTEED_NO_EVICT): admit only when the prompt + max_tokens of it and of
# every running sequence fit, so nothing is ever preempted, at the cost of a smaller batch.
ADMISSION_POLICIES = ("greedy", "reserve")
# Weight precision: "int8" is W8A8, weights per channel, activations per token at run time
# (engine/model/int8_linear.py); the LM head and embeddings stay in the engine's dtype.
QUANTIZATIONS = ("none", "int8")
# The KV cache's element type: "auto" is the engine's dtype; "fp8" (e4m3, no scales, as vLLM's
# --kv-cache-dtype fp8 without calibration) holds 2x bf16's tokens, 4x fp32's, in the same budget.
KV_CACHE_DTYPES = ("auto", "fp8")
# What a running engine takes without a rebuild (LLMEngine.reconfigure): the scheduler reads them.
IN_PLACE_FIELDS = frozenset({
    "max_num_seqs", "max_batched_tokens", "chunked_prefill", "prefix_caching", "starvation_s", "aging",
    "num_speculative_tokens", "spec_lookup_min", "spec_lookup_max",
})  # fmt: skip


@dataclass
class EngineConfig:
    model: str | None = None  # GGUF file or HF folder; None means the default SmolLM2 GGUF
    dtype: str = "auto"  # DTYPES; what it resolves to and why: engine/platform/machine.py
    # "auto": the first CUDA device where torch sees one, else the CPU (engine/platform/machine.py
    # resolve_device); "cpu", "cuda" (cuda:0) or "cuda:N". A replica of several ranks takes N onwards.
    device: str = "auto"
    quantization: str = "none"  # QUANTIZATIONS
    kv_cache_dtype: str = "auto"  # KV_CACHE_DTYPES
    # Paged KV cache + continuous batching; False is static batches over contiguous KV slabs.
    paged: bool = True
    block_size: int = 16
    kv_budget_mb: float | None = None  # None: what memory_cap_mb leaves after weights/activations
    memory_cap_mb: float = 2048.0  # per-device memory the replica may use in all (the CPU)
    # On CUDA, the share of the card's memory this replica may use in all (vLLM's
    # --gpu-memory-utilization): the KV cache gets what this leaves once the weights, one profiled
    # widest step and the CUDA runtime's own memory (context, cuBLAS, NCCL) are measured; memory_cap_mb
    # does not apply there. What other processes hold on the card comes out of it too.
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048
    chunked_prefill: bool = True
    prefix_caching: bool = True
    max_model_len: int | None = None  # None: the model's context length
    # Fairness: a waiter older than this gets one reserved admission slot per step.
    starvation_s: float = 5.0
    aging: bool = True  # the defence lever: off, no waiter is ever favoured for its age
    admission: str = "greedy"  # ADMISSION_POLICIES
    # vLLM v0's watermark (BlockSpaceManager(watermark=0.01), `can_allocate`): greedy admission takes a
    # prompt only if its whole prompt fits and this fraction of all KV blocks stays free, so a long
    # prompt does not start on its first chunk's room and thrash (BENCHMARKS.md "Long contexts").
    # 0.0: admit as soon as the first chunk fits (vLLM v1's rule, the default).
    kv_watermark: float = 0.0
    num_threads: int | None = None  # torch CPU threads; None leaves torch's default
    # Fewer threads while other processes keep this replica's cores busy (engine/platform/threads.py); the
    # most it uses is num_threads. Off: the count is fixed (benchmarks that compare thread counts).
    adaptive_threads: bool = True
    # Ranks (processes) one replica's model is split across (engine/parallel/distributed.py); at most the
    # model's KV heads. memory_cap_mb applies to each rank.
    tensor_parallel: int = 1
    # Pipeline stages (engine/parallel/distributed.py): the layers split into this many contiguous stages,
    # one process (or TP group) each; a replica is tensor_parallel x pipeline_parallel ranks. At
    # most the model's layers. memory_cap_mb applies to each rank.
    pipeline_parallel: int = 1
    # Up to pipeline_parallel batches in flight, so the stages work at once (vLLM's virtual
    # engines); off, one batch at a time, and every stage idles while the others work (the bubble).
    pipeline_overlap: bool = True
    # The forward through torch.compile (engine/model/compile.py): CPU, the C++ op, one rank.
    compile: bool = False
    # The CPU KV cache on 2 MiB pages (engine/platform/huge_pages.py): attention over scattered blocks 15%
    # faster, but touching them costs every start 5-10 s on these VMs; like compile, off by
    # default (the lab's rebuilds and the test suite's engines would pay it), on in `make bench`.
    huge_pages: bool = False
    # A tensor-parallel group's collectives time out (the group fails loudly and is replaced);
    # off, a stopped rank leaves the others waiting inside a collective forever.
    collective_timeout: bool = True
    # Kernels whose reduction order does not depend on the batch (a cost, not a defence).
    batch_invariant: bool = False
    # CUDA graphs for decode-only steps (engine/worker/cuda_graphs.py): each padded batch size's forward
    # is captured once and replayed, so a small model's decode is not bound by ~600 kernel launches;
    # kept only for the sizes where the replay measured faster at capture. CUDA, one rank only.
    cuda_graphs: bool = True
    # Two scheduling policies of the 2024 Python engines, for the simulator's checks against their
    # published runs (bench/sim_latency.py); neither is a lab lever. prefill_first: a step runs
    # prompt work only whenever a prompt can be scheduled, else the running decodes alone (vLLM v0's
    # default scheduler without chunked prefill, SGLang 0.3 without --enable-mixed-chunk); off, the
    # running sequences and new prompts share every step (vLLM v1, TensorRT-LLM).
    prefill_first: bool = False
    # Multi-step scheduling (vLLM 0.6's --num-scheduler-steps): a decode-only batch runs this many
    # steps before the scheduler looks again (nothing is admitted meanwhile), and the run's tokens
    # are delivered together when it ends. A step with prompt work is always a single step.
    scheduler_steps: int = 1
    # Speculative decoding by n-gram prompt lookup (engine/sample/spec_decode.py; vLLM's speculative_config
    # method "ngram"): a decode guesses up to this many next tokens from where its last
    # spec_lookup_max..spec_lookup_min tokens appeared before (vLLM's prompt_lookup_max / _min), and
    # one forward pass checks them. 0: off. Paged, one pipeline stage and one scheduler step only.
    num_speculative_tokens: int = 0
    spec_lookup_min: int = 2
    spec_lookup_max: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.device, str) or not DEVICE_PATTERN.fullmatch(self.device):
            raise InvalidParamError("device", f"must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        utilisation = self.gpu_memory_utilization
        if isinstance(utilisation, bool) or not isinstance(utilisation, (int, float)) or not 0 < utilisation <= 1:
            raise InvalidParamError("gpu_memory_utilization", f"must be a fraction in (0, 1], got {utilisation!r}")
        if self.dtype not in DTYPES:
            raise InvalidParamError("dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        positive_ints = (
            "block_size", "max_num_seqs", "max_batched_tokens", "tensor_parallel", "pipeline_parallel", "scheduler_steps",
        )
        for name in positive_ints:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidParamError(name, f"must be a positive integer, got {value!r}")
        if self.block_size > 256:
            raise InvalidParamError("block_size", "must be at most 256")
        if self.kv_budget_mb is not None and not self.kv_budget_mb > 0:
            raise InvalidParamError("kv_budget_mb", f"must be positive, got {self.kv_budget_mb!r}")
        if not self.memory_cap_mb > 0:
            raise InvalidParamError("memory_cap_mb", "must be positive")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise InvalidParamError("max_model_len", "must be positive")
        if self.quantization not in QUANTIZATIONS:
            raise InvalidParamError("quantization", f"must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidParamError("kv_cache_dtype", f"must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.admission not in ADMISSION_POLICIES:
            raise InvalidParamError("admission", f"must be one of {ADMISSION_POLICIES}, got {self.admission!r}")
        watermark = self.kv_watermark
        if isinstance(watermark, bool) or not isinstance(watermark, (int, float)) or not 0 <= watermark < 1:
            raise InvalidParamError("kv_watermark", f"must be a fraction in [0, 1), got {watermark!r}")
        if self.starvation_s < 0:
            raise InvalidParamError("starvation_s", "must not be negative")
        if not isinstance(self.prefill_first, bool):
            raise InvalidParamError("prefill_first", f"must be true or false, got {self.prefill_first!r}")
        if not self.paged and (self.prefill_first or self.scheduler_steps > 1):
            name = "prefill_first" if self.prefill_first else "scheduler_steps"
            raise InvalidParamError(name, "is a policy of the paged scheduler: static batches (paged=false) run whole")
        for name in ("num_speculative_tokens", "spec_lookup_min", "spec_lookup_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 16:
                raise InvalidParamError(name, f"must be an integer in [0, 16], got {value!r}")
        if not 1 <= self.spec_lookup_min <= self.spec_lookup_max:
            raise InvalidParamError("spec_lookup_min", "must be at least 1 and at most spec_lookup_max")
        if self.num_speculative_tokens and (not self.paged or self.pipeline_parallel > 1 or self.scheduler_steps > 1):
            raise InvalidParamError(
                "num_speculative_tokens", "speculates on the paged scheduler, one pipeline stage, one scheduler step"
            )
        if self.scheduler_steps > 1 and self.pipeline_parallel > 1:
            raise InvalidParamError("scheduler_steps", "a multi-step run is one batch at a time: needs pipeline_parallel 1")

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}
