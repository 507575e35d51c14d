"""One place that knows the machine: which CPU features this process may use, which CUDA devices
there are, and what the engine chooses from them (dtype, linear and attention paths, compile,
threads). Every such choice reads this module; nothing else asks the CPU.

The CPU's features come from engine/platform/cpu_features.py: CPUID itself on x86-64 (so `qemu-x86_64
-cpu Haswell` is seen as the Haswell it emulates), else /proc/cpuinfo; on ARM64 from
/proc/cpuinfo's Features (Linux) or sysctl (macOS). They are grouped into tiers,
each a CPU class the project has a fastest path for:

    x86-64: scalar < avx2 (AVX2, FMA, F16C) < avx512 (F, BW, VL, DQ) < avx512_bf16 < amx
    ARM64:  scalar < neon < neon_bf16

SERVELAB_CPU_ISA=<tier> caps the tier (tests, benchmarks): the project then behaves exactly as on
a CPU of that tier. `apply_isa_override()`, run when the engine package is imported, before torch
loads, caps torch's own kernels the same way (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY,
MKL_ENABLE_INSTRUCTIONS; a value already in the environment wins), and the C++ op reads the same
variable (engine/kernels/csrc/cpu_isa.h). A cap above the hardware is refused at start.

This module imports no torch at import time: the web process reads it too.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.errors import InvalidParamError
from engine.platform.cpu_features import arm_features, cpuid_features, proc_cpuinfo

ENV_ISA = "SERVELAB_CPU_ISA"
X86_TIERS = ("scalar", "avx2", "avx512", "avx512_bf16", "amx")
ARM_TIERS = ("scalar", "neon", "neon_bf16")
# The features each tier adds to the one below it: a tier's CPU has all of them.
TIER_FEATURES: dict[str, tuple[str, ...]] = {
    "scalar": (),
    "avx2": ("avx", "avx2", "fma", "f16c"),
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "avx512_bf16": ("avx512_bf16",),
    "amx": ("amx_tile", "amx_bf16"),
    "neon": ("asimd",),
    "neon_bf16": ("bf16",),
}
# Features a CPU of a tier may have beside its defining ones (kept or hidden with that tier).
TIER_EXTRAS: dict[str, tuple[str, ...]] = {
    "avx2": ("avx_vnni", "avx_ne_convert"),
    "avx512": ("avx512_vnni", "avx512cd"),
    "amx": ("amx_int8",),
    "neon": ("i8mm", "sve"),
}
# What torch's own kernels are capped to on a tier (set only when SERVELAB_CPU_ISA asks).
TORCH_CAPS: dict[str, dict[str, str]] = {
    "scalar": {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx512_bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "ATEN_CPU_CAPABILITY": "avx512"},
    "amx": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX", "ATEN_CPU_CAPABILITY": "avx512"},
    "neon": {"ATEN_CPU_CAPABILITY": "default"},
    "neon_bf16": {},
}


class MachineError(RuntimeError):
    """The machine cannot do what was asked (a tier above the hardware, bf16 the CPU cannot run)."""


@dataclass(frozen=True)
class CpuInfo:
    arch: str  # "x86_64", "aarch64" (macOS's arm64 too), or what platform.machine() says
    model: str  # the CPU's name, as the OS gives it
    system: str  # "Linux", "Darwin", ...
    hardware_features: frozenset[str]  # what the CPU has (unaffected by SERVELAB_CPU_ISA)
    hardware_tier: str
    tier: str  # what this process uses: the hardware's, capped by SERVELAB_CPU_ISA
    override: str | None  # SERVELAB_CPU_ISA, when set
    cores: int  # the cores this process may run on
    source: str  # where the features came from: "cpuid", "/proc/cpuinfo", "sysctl", "none"

    @property
    def features(self) -> frozenset[str]:
        """The features this process may use: the hardware's, less those above its tier."""
        tiers = X86_TIERS if self.arch == "x86_64" else ARM_TIERS
        allowed: set[str] = set()
        for tier in tiers[: tiers.index(self.tier) + 1]:
            allowed |= set(TIER_FEATURES[tier]) | set(TIER_EXTRAS.get(tier, ()))
        return self.hardware_features & frozenset(allowed)

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def native_bf16(self) -> bool:
        """Whether this CPU multiplies bf16 in hardware (AMX, AVX512-BF16, ARM's BF16)."""
        return self.tier in ("amx", "avx512_bf16", "neon_bf16")

    @property
    def onednn_bf16(self) -> bool:
        """Whether oneDNN's bf16 matmul (the prepacked linear) runs here at all: it needs
        AVX512 BW/VL/DQ or AVX-NE-CONVERT, and emulates bf16 on the former without AVX512-BF16."""
        return self.arch == "x86_64" and (X86_TIERS.index(self.tier) >= X86_TIERS.index("avx512") or self.has("avx_ne_convert"))

    @classmethod
    def of_tier(cls, tier: str, arch: str = "x86_64") -> CpuInfo:
        """A CPU of exactly this tier (what the project would choose on it): tests, docs."""
        tiers = X86_TIERS if arch == "x86_64" else ARM_TIERS
        features = {f for t in tiers[: tiers.index(tier) + 1] for f in TIER_FEATURES[t]}
        return cls(arch, f"a {tier} CPU", "Linux", frozenset(features), tier, tier, None, 2, "of_tier")

    def describe(self) -> str:
        capped = f" (capped by {ENV_ISA}={self.override}; the hardware is {self.hardware_tier})" if self.override else ""
        return f"{self.model}, {self.arch} {self.tier}{capped}, {self.cores} cores"


def _tier_of(features: frozenset[str], tiers: tuple[str, ...]) -> str:
    best = tiers[0]
    for tier in tiers[1:]:
        if not set(TIER_FEATURES[tier]) <= features:
            break
        best = tier
    return best


def usable_cores() -> int:
    """The cores this process may run on (its affinity on Linux; every core elsewhere)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def affinity() -> list[int]:
    """The cores this process may run on, by number (0..n-1 where the OS has no affinity call)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def set_affinity(cores: list[int]) -> bool:
    """Pin this process to cores where the OS can (Linux); says whether it did."""
    if hasattr(os, "sched_setaffinity") and cores:
        os.sched_setaffinity(0, cores)
        return True
    return False


@functools.cache
def cpu() -> CpuInfo:
    """This process's CPU, probed once."""
    arch = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)
    system = platform.system()
    if arch == "x86_64":
        tiers = X86_TIERS
        try:
            features, model = cpuid_features()
            source = "cpuid"
        except (OSError, ValueError, AttributeError):  # no executable mapping allowed here
            features, model = proc_cpuinfo()
            source = "/proc/cpuinfo"
        if not model:
            model = proc_cpuinfo()[1] or platform.processor() or "x86-64"
    elif arch == "aarch64":
        tiers = ARM_TIERS
        features, model, source = arm_features()
    else:
        tiers, features, model, source = ("scalar",), frozenset(), platform.processor() or arch, "none"
    hardware = _tier_of(features, tiers)
    override = os.environ.get(ENV_ISA) or None
    tier = hardware
    if override is not None:
        if override not in tiers:
            raise MachineError(f"{ENV_ISA}={override}: this {arch} CPU's tiers are {', '.join(tiers)}")
        if tiers.index(override) > tiers.index(hardware):
            raise MachineError(f"{ENV_ISA}={override}: this CPU ({model}) is {hardware}; a cap cannot add features")
        tier = override
    return CpuInfo(arch, model, system, features, hardware, tier, override, usable_cores(), source)


def apply_isa_override(tier: str | None = None) -> None:
    """With SERVELAB_CPU_ISA set (or tier given, which sets it: a bench's `--isa`), cap torch's
    kernels (oneDNN, ATen, MKL) to that tier too, before torch reads its environment (oneDNN reads
    its cap once). A value the user already set is kept."""
    if tier:
        os.environ[ENV_ISA] = tier
    tier = os.environ.get(ENV_ISA)
    for name, value in TORCH_CAPS.get(tier or "", {}).items():
        os.environ.setdefault(name, value)


# ---- what the engine runs ------------------------------------------------------------------


@dataclass(frozen=True)
class CudaInfo:
    name: str
    capability: tuple[int, int]
    count: int

    @property
    def native_bf16(self) -> bool:
        return self.capability >= (8, 0)  # Ampere and later


@functools.cache
def cuda(index: int = 0) -> CudaInfo | None:
    """CUDA device `index`, if torch sees it (imports torch)."""
    import torch

    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    return CudaInfo(torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index), torch.cuda.device_count())


def cuda_index(device: str) -> int:
    return int(device.partition(":")[2] or 0)


def resolve_device(requested: str, replica_index: int = 0, ranks: int = 1) -> str:
    """The device a replica's rank 0 runs on (imports torch where CUDA is asked or may be):
    "auto" is CUDA where torch sees a GPU, else the CPU; "cuda" is cuda:0. Replica i of `ranks`
    ranks each starts at base + i * ranks, wrapping round the GPUs there are (replicas then share
    a card, each within gpu_memory_utilization of it). Asking for CUDA where there is none, or
    for a card past the last, is an error that names the device."""
    if requested == "cpu":
        return "cpu"
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "auto" and count == 0:
        return "cpu"
    return place_on_gpus(requested, count, replica_index, ranks)


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, read without torch (the web process is torch-free): the
    driver's list, narrowed by CUDA_VISIBLE_DEVICES."""
    try:
        found = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    return min(found, len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")]))


def device_kind(device: str) -> str:
    """"cuda" or "cpu": what a replica asked for `device` will run on, decided without torch."""
    if device == "auto":
        return "cuda" if visible_gpus() else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def place_on_gpus(requested: str, count: int, replica_index: int = 0, ranks: int = 1) -> str:
    """cuda:N for the replica's rank 0 given `count` visible GPUs (torch-free: unit-tested)."""
    if count == 0:
        raise InvalidParamError("device", f"{requested!r} asks for CUDA, and torch sees no CUDA device here")
    base = cuda_index(requested)
    if base + ranks > count:
        raise InvalidParamError(
            "device", f"{requested!r} with {ranks} rank(s) needs cuda:{base}..cuda:{base + ranks - 1}; there are {count} GPUs"
        )
    span = count - base - (count - base) % ranks  # whole replicas fit from base onwards
    return f"cuda:{base + (replica_index * ranks) % span}"


def describe_cuda(device: str = "cuda:0") -> str:
    info = cuda(cuda_index(device))
    return "no CUDA device" if info is None else f"{info.name} (sm_{info.capability[0]}{info.capability[1]}) x {info.count}"


def auto_dtype(device: str, info: CpuInfo | None = None) -> tuple[str, str]:
    """(dtype, why) for dtype="auto": bf16 where the device multiplies it natively, else fp32
    (CUDA before Ampere: fp16). info: the CPU (default: this one's)."""
    if device.startswith("cuda"):
        info = cuda(cuda_index(device))
        if info is None:
            return "float32", "no CUDA device"
        if info.native_bf16:
            return "bfloat16", f"{info.name} (sm_{info.capability[0]}{info.capability[1]}) has bf16 tensor cores"
        return "float16", f"{info.name} (sm_{info.capability[0]}{info.capability[1]}) has no bf16; fp16 tensor cores"
    info = info or cpu()
    if info.native_bf16:
        how = {"amx": "AMX tiles", "avx512_bf16": "AVX512-BF16", "neon_bf16": "ARM BF16"}[info.tier]
        return "bfloat16", f"this CPU multiplies bf16 natively ({how})"
    return "float32", f"this CPU has no native bf16 ({info.tier})"


def resolve_dtype(requested: str, device: str, info: CpuInfo | None = None) -> tuple[str, str]:
    """The dtype an engine runs and why: `auto` as auto_dtype; an explicit choice as asked, with
    what it costs here (bf16 on a CPU without it runs correctly on a slower path)."""
    if requested == "auto":
        return auto_dtype(device, info)
    if device.startswith("cuda") or requested == "float32":
        return requested, "asked"
    info = info or cpu()
    if requested == "bfloat16" and not info.native_bf16:
        return requested, f"asked; this CPU has no native bf16 ({info.tier}), so it runs slower than float32 here"
    if requested == "float16":
        return requested, "asked; CPUs widen fp16 to fp32 for every matmul"
    return requested, "asked"


@dataclass(frozen=True)
class EnginePlan:
    """What one engine runs on this machine, and why: `/health`, `/v1/models` and the page header
    show it."""

    device: str
    dtype: str
    dtype_reason: str
    linear: str  # "onednn-prepacked", "torch" (MKL/OpenBLAS/Accelerate), "cublas", "int8 <path>" (int8_linear.py)
    attention: str  # "cpu-op/<tier>", "torch", "triton"
    compile: bool
    threads: int
    hardware: str  # CpuInfo.describe(), or the CUDA device
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return f"{self.dtype} ({self.dtype_reason}); linear {self.linear}, attention {self.attention}"


def linear_path(dtype: str, device: str) -> str:
    """Which matmul the linears take: oneDNN's prepacked weights where oneDNN runs this dtype on
    this x86-64 CPU (bf16: AVX512 BW/VL/DQ or AVX-NE-CONVERT; fp32: any), else torch's own
    (F.linear: MKL, OpenBLAS or Accelerate). fp32 prepacked ran the model's linears 1.3-2x faster
    than MKL's F.linear from 2 rows up, and the LM head 1.7-3x at every row count, on AVX2 and
    AVX-512 alike (bench/linear_paths.py)."""
    if device.startswith("cuda"):
        return "cublas"
    info = cpu()
    if info.arch != "x86_64" or not _mkldnn():
        return "torch"
    if (dtype == "bfloat16" and info.onednn_bf16) or dtype == "float32":
        return "onednn-prepacked"
    return "torch"


def attention_path(device: str, op_built: bool) -> str:
    if device.startswith("cuda"):
        return "triton"
    return f"cpu-op/{cpu().tier}" if op_built else "torch"


def _mkldnn() -> bool:
    import torch

    return bool(torch.backends.mkldnn.is_available())
