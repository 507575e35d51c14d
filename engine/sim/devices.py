"""The devices a what-if run can simulate: datasheet peaks and the achieved fractions of them.

GPU figures come from constants.py; `cpu` (this machine) comes from the calibration
engine/sim/calibration.py picks (this machine's, from `make calibrate`, else the committed
reference machine's), fitted to the live engine's own step times."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.catalog import DEVICE_NAMES
from engine.sim import calibration
from engine.sim import constants as C

CPU_CALIBRATION = calibration.REFERENCE  # the reference machine's, committed


@dataclass(frozen=True)
class Device:
    name: str
    memory_gb: float  # the datasheet label
    memory_bytes: int
    mem_bw: float  # bytes/s
    peak_flops: dict[str, float]  # weight dtype -> dense FLOP/s of the GEMMs (bf16 always present)
    link_bw: float  # bytes/s one way, scale-up link; 0 for none
    gemm_efficiency: float = C.GEMM_EFFICIENCY
    fp4_gemm_efficiency: float = C.FP4_GEMM_EFFICIENCY  # NVFP4's own, below BF16's (constants.py)
    attention_efficiency: float = C.ATTENTION_EFFICIENCY
    fp8_attention: bool = False  # attention over an FP8 KV cache runs on FP8 tensor cores
    bw_efficiency: float = C.BW_EFFICIENCY
    link_efficiency: float = C.LINK_EFFICIENCY
    step_overhead_s: float = C.STEP_OVERHEAD_S
    layer_overhead_s: float = C.KERNEL_LAUNCH_S * C.KERNELS_PER_LAYER
    allreduce_latency_s: float = C.ALLREDUCE_LATENCY_S
    sample_overhead_s: float = C.SAMPLE_OVERHEAD_S
    # Host time per sampled row (a live CPU engine's Python per sequence: scheduling, sampling,
    # postprocess, detokenize); 0 on GPUs, where the per-step constants cover the host.
    token_overhead_s: float = 0.0
    # When the HTTP front and the clients run on the device's own cores (the live server on this
    # machine): their CPU per streamed token, which stalls the engine's threads, and the request's
    # hops through HTTP and SSE. Measured by `make calibrate` (bench/calibrate_front.py); 0 on GPUs.
    front_token_s: float = 0.0
    front_latency_s: float = 0.0
    # A GPU streams the weights while its tensor cores compute (a GEMM costs the larger of the two);
    # a CPU's cores do both, so at the small M of serving steps the two add (calibrated: a 32-token
    # prefill takes 50-59 ms here against the 32 ms the larger of the two gives).
    gemm_overlaps_memory: bool = True
    runtime_reserve_bytes: int = C.RUNTIME_RESERVE_BYTES
    kv_free_fraction: float = C.KV_FREE_FRACTION
    activation_bytes: float = C.ACTIVATION_BYTES
    gpus_per_node: int = C.GPUS_PER_NODE

    def gemm_flops(self, dtype: str) -> float:
        """Achieved GEMM FLOP/s for weights of dtype; a dtype without tensor cores (fp8 on A100)
        runs weight-only: its bytes shrink, its math is bf16."""
        efficiency = self.fp4_gemm_efficiency if dtype == "fp4" else self.gemm_efficiency
        return self.peak_flops.get(dtype, self.peak_flops["bf16"]) * efficiency

    def attention_flops(self, kv_dtype: str) -> float:
        """Achieved attention FLOP/s over a KV cache of kv_dtype: BF16 math, or FP8 where the
        device's kernels compute in FP8 (FlashAttention-3's measured FP8 / BF16 ratio)."""
        speedup = C.FP8_ATTENTION_SPEEDUP if kv_dtype == "fp8" and self.fp8_attention else 1.0
        return self.peak_flops["bf16"] * self.attention_efficiency * speedup

    @property
    def bandwidth(self) -> float:
        return self.mem_bw * self.bw_efficiency

    def with_front(self) -> Device:
        """This device with the front and clients on its cores: each sampled row costs their CPU too."""
        return dataclasses.replace(self, token_overhead_s=self.token_overhead_s + self.front_token_s)

    def supports(self, dtype: str) -> bool:
        return dtype != "fp4" or "fp4" in self.peak_flops


def _gpu(name: str) -> Device:
    memory_gb, bw, bf16, fp8, fp4, link = C.DEVICE_TABLE[name]
    peaks = {k: v for k, v in (("bf16", bf16), ("fp8", fp8), ("fp4", fp4)) if v is not None}
    return Device(name, memory_gb, int(memory_gb * C.GiB), bw, peaks, link, fp8_attention=name in C.FP8_ATTENTION_DEVICES)


def _cpu() -> Device | None:
    """This machine, from its calibration (engine/sim/calibration.py: this machine's own where
    `make calibrate` wrote one, else the reference machine's, which every prediction then names
    as foreign); None when there is neither."""
    found = calibration.load()
    if found is None:
        return None
    fit, front = found.data["device"], found.data.get("front", {})
    return Device(
        "cpu", fit["memory_gb"], int(fit["memory_gb"] * C.GiB), fit["mem_bw"], {"bf16": fit["flops"]}, 0.0,
        gemm_efficiency=1.0, attention_efficiency=fit["attention_efficiency"], bw_efficiency=1.0,
        step_overhead_s=fit["step_overhead_s"], layer_overhead_s=fit["layer_overhead_s"],
        sample_overhead_s=fit["sample_overhead_s"], token_overhead_s=fit.get("token_overhead_s", 0.0),
        front_token_s=front.get("cpu_per_token_s", 0.0), front_latency_s=front.get("latency_s", 0.0),
        gemm_overlaps_memory=fit.get("gemm_overlaps_memory", True), runtime_reserve_bytes=0, gpus_per_node=1,
        # The live CPU engine's own plan: its whole cap, float32 activations (engine/core/memory.py).
        kv_free_fraction=1.0, activation_bytes=4,
    )


# The lever's names (engine/catalog.py, below the simulator) and the table's must agree.
if set(DEVICE_NAMES) != {*C.DEVICE_TABLE, "cpu"}:
    raise ImportError("engine/catalog.py DEVICE_NAMES and engine/sim/constants.py DEVICE_TABLE name different devices")


def get_device(name: str) -> Device:
    """The device by name, case-insensitive; KeyError names the known ones."""
    key = name.lower()
    if key in C.DEVICE_TABLE:
        return _gpu(key)
    if key == "cpu":
        cpu = _cpu()
        if cpu is None:
            raise KeyError("device cpu is not calibrated yet: run `make calibrate`")
        return cpu
    raise KeyError(f"unknown device {name!r}; known devices: {', '.join(DEVICE_NAMES)}")
