"""Every constant of the what-if executor, each with its source. Nothing else in engine/sim holds
a number about hardware: devices, efficiencies, overheads and memory reserves all live here.

Sources are in ../shared/whatif/REFERENCES.md (datasheets, AIConfigurator, BLIS, Databricks,
sglang PR 2904). Achieved fractions were chosen inside the published ranges and then checked
against the TensorRT-LLM perf-overview rows (bench/sim_trtllm.py, BENCHMARKS.md); they are
physics knobs, not a lookup of those rows.
"""

from __future__ import annotations

GiB = 1024**3
TB = 1e12
GB = 1e9
TFLOPS = 1e12
US = 1e-6

# Datasheet figures per device (dense tensor-core peaks: NVIDIA quotes Hopper with sparsity,
# halved here). memory_gb is the datasheet label; HBM stacks are binary (an "80 GB" H100 shows
# 81,559 MiB in nvidia-smi), so capacity in bytes is memory_gb * GiB.
# Columns: memory_gb, memory bandwidth, BF16 dense, FP8 dense, FP4 dense (None: no such tensor
# cores), scale-up link bandwidth one way (NVLink4 900 GB/s = 450 each way).
DEVICE_TABLE: dict[str, tuple[float, float, float, float | None, float | None, float]] = {
    # NVIDIA H100 SXM datasheet; TokenSim data/devices/h100_sxm.yaml
    "h100": (80, 3.35 * TB, 989 * TFLOPS, 1979 * TFLOPS, None, 450 * GB),
    # NVIDIA H200 SXM datasheet; TokenSim h200_sxm.yaml
    "h200": (141, 4.8 * TB, 989 * TFLOPS, 1979 * TFLOPS, None, 450 * GB),
    # NVIDIA A100 SXM 80GB datasheet: no FP8 tensor cores (fp8 weights run weight-only, bf16 math)
    "a100": (80, 2.039 * TB, 312 * TFLOPS, None, None, 300 * GB),
    # NVIDIA HGX B200 datasheet (7.7-8 TB/s: 7.7 taken)
    "b200": (180, 7.7 * TB, 2250 * TFLOPS, 4500 * TFLOPS, 9000 * TFLOPS, 900 * GB),
    # NVIDIA L4 datasheet; no NVLink: PCIe 4 x16 is 32 GB/s each way
    "l4": (24, 0.30 * TB, 121 * TFLOPS, 242 * TFLOPS, None, 32 * GB),
    # AMD MI300X datasheet; Infinity Fabric ~896 GB/s aggregate = 448 each way
    "mi300x": (192, 5.3 * TB, 1307 * TFLOPS, 2615 * TFLOPS, None, 448 * GB),
}
GPUS_PER_NODE = 8  # HGX/OAM boards: TP beyond a node crosses the fabric
INTER_NODE_BW = 50 * GB  # 400 Gb/s InfiniBand NDR per GPU, the common H100 cluster fabric

# Achieved fractions of peak (REFERENCES "What real stacks achieve").
GEMM_EFFICIENCY = 0.62  # BLIS calibrated H100 prefill MFU ~0.65
ATTENTION_EFFICIENCY = 0.50  # flash-attention forward reaches about half of dense peak on Hopper
BW_EFFICIENCY = 0.80  # AIConfigurator 0.8 (BLIS 0.72; Databricks ~0.6 at batch 1 with TP)
LINK_EFFICIENCY = 0.70  # achieved bus bandwidth of NCCL all-reduce on NVLink, ~70% of the link
# NVFP4 GEMMs (W4A4, Blackwell's block-scaled MMA) reach a smaller share of their dense peak than
# BF16 does. Measured on B200 at large M: 2.95-3.04 PFLOP/s with the activations' quantisation and
# 3.65-3.90 without (vLLM PR 20646, benchmarks/kernels/bench_nvfp4_gemm.py, Llama-3.1-8B's
# N=6144 K=4096, M 4,096-16,384: 0.33-0.43 of 9 PF); 3.37 PF from CUTLASS at M=1,024 N=7,168
# K=4,608 (FlashInfer PR 1979: 0.37). The middle of that range. The same vLLM run puts B200's BF16
# at 1.36-1.42 PF, 0.60-0.63 of its peak: GEMM_EFFICIENCY's value.
FP4_GEMM_EFFICIENCY = 0.38
# Attention over an FP8 KV cache runs on FP8 tensor cores where the kernels do (FlashAttention-3
# and TensorRT-LLM's FP8 FMHA on Hopper and later; vLLM docs, quantized_kvcache.md: "attention
# operations are also performed in the quantized (FP8) domain"). FlashAttention-3 (Shah et al.,
# 2024) on H100: FP16 "up to 740 TFLOPs/s", FP8 "close to 1.2 PFLOPs/s": its measured ratio.
FP8_ATTENTION_SPEEDUP = 1.2 / 0.74
FP8_ATTENTION_DEVICES = frozenset({"h100", "h200", "b200"})  # Hopper and Blackwell; not Ada's L4

# Elementwise kernels between the GEMMs move activations through HBM, per token per layer, in
# elements: two RMSNorms (read + write hidden: 4h), RoPE on q and k (read + write: 2(q + kv)),
# SwiGLU (read gate and up, write the product: 3f). Residual adds and FP8 quantisation fuse
# into the norms (TensorRT-LLM's fused kernels), so they add nothing.
ELEMENTWISE_HIDDEN = 4
ELEMENTWISE_QK = 2
ELEMENTWISE_FFN = 3

# Host and launch overheads.
KERNEL_LAUNCH_S = 3 * US  # AIConfigurator: ~3 us fixed latency per kernel launch
KERNELS_PER_LAYER = 7  # norm, qkv, attention, o, norm, gate_up, down (BLIS: ~20 us per layer)
STEP_OVERHEAD_S = 200 * US  # host-side scheduling + input build per step (BLIS: ~500 us for vLLM;
# TensorRT-LLM's C++ runtime with CUDA graphs is leaner)
ALLREDUCE_LATENCY_S = 10 * US  # AIConfigurator ~10 us per collective; sglang PR 2904: 5-10 us at 512 B
ALLREDUCES_PER_LAYER = 2  # after attention's o-projection and after the MLP's down-projection
SAMPLE_OVERHEAD_S = 20 * US  # one sampling kernel per step (top-k/argmax over the logits)

# Memory plan per GPU (AIConfigurator: 392 MB NCCL buffers + ~3.5 GB runtime reserved per GPU).
RUNTIME_RESERVE_BYTES = int(3.5 * GiB)
NCCL_BUFFER_BYTES = 392 * 1024**2  # only with tensor parallelism
KV_FREE_FRACTION = 0.90  # TensorRT-LLM perf runs: KV cache takes 0.90-0.95 of free memory
ACTIVATION_BYTES = 2  # bf16 activations on a GPU (the live CPU engine plans float32)

# Bytes per element of each weight / KV dtype. fp4 carries one fp8 scale per 16 values (NVFP4).
DTYPE_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5 + 1 / 16}
# Embeddings and the LM head stay in bf16 in ModelOpt FP8/FP4 checkpoints.
EMBED_BYTES = 2.0

# Cold start: a new replica reads its weight shard from storage before it serves; every GPU of
# a TP group reads its own shard at once. 2 GB/s per GPU is an assumption between object-store
# streaming into one process (about 1 GB/s) and a node's local NVMe RAID shared by 8 GPUs
# (p5.48xlarge: 8 x 3.84 TB NVMe, ~25 GB/s read, ~3 GB/s a GPU); a CLI setting, not a measurement.
STORAGE_BW = 2 * GB

# The planner's default GPU-hour prices (USD, on demand, per GPU), which --gpu-hour-usd replaces:
# the specialty-cloud tier's middle in Mercatus's May 2026 survey of 22 providers (A100 80GB
# $1.10-1.50, H100 SXM $2.50-3.50, H200 SXM $3.50-4.50) and B200 on specialized clouds at
# $4.50-6.00 (Lyceum, March 2026). L4 and MI300X have no default: a plan that considers them
# must be given their price.
GPU_HOUR_USD = {"a100": 1.30, "h100": 3.00, "h200": 4.00, "b200": 5.25}
