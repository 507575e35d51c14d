"""What the CPU says it has: CPUID on x86-64 (a few bytes of machine code run through ctypes, so
an emulator such as `qemu-x86_64 -cpu Haswell` is seen as the CPU it emulates), /proc/cpuinfo's
flags (Linux), sysctl (macOS). Feature names follow Linux's /proc/cpuinfo. engine/platform/machine.py
turns them into tiers and choices."""

from __future__ import annotations

import ctypes
import mmap
import platform
import subprocess
import sys
from typing import Any

# ---- x86-64: CPUID through ctypes -----------------------------------------------------------

# uint32 regs[4]; cpuid(leaf, subleaf, regs): push rbx; mov eax,edi; mov ecx,esi; mov r8,rdx;
# cpuid; mov [r8],eax; mov [r8+4],ebx; mov [r8+8],ecx; mov [r8+12],edx; pop rbx; ret
_CPUID_CODE = bytes.fromhex("53" "89f8" "89f1" "4989d0" "0fa2" "418900" "41895804" "41894808" "4189500c" "5b" "c3")
# uint64 xgetbv(index): mov ecx,edi; xgetbv; shl rdx,32; or rax,rdx; ret
_XGETBV_CODE = bytes.fromhex("89f9" "0f01d0" "48c1e220" "4809d0" "c3")


class _Native:
    """Runs a few bytes of x86-64 machine code as a C function (kept mapped for the process)."""

    def __init__(self, code: bytes, restype: Any, argtypes: list[Any]) -> None:
        self._mem = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        self._mem.write(code)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._mem))
        self.fn = ctypes.CFUNCTYPE(restype, *argtypes)(address)


def cpuid_features() -> tuple[frozenset[str], str]:
    # Both stay referenced until the function returns: their pages go with them.
    cpuid_code = _Native(_CPUID_CODE, None, [ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)])
    xgetbv_code = _Native(_XGETBV_CODE, ctypes.c_uint64, [ctypes.c_uint32])
    cpuid, xgetbv = cpuid_code.fn, xgetbv_code.fn

    def regs(leaf: int, sub: int = 0) -> tuple[int, int, int, int]:
        out = (ctypes.c_uint32 * 4)()
        cpuid(leaf, sub, out)
        return out[0], out[1], out[2], out[3]

    def bit(value: int, n: int) -> bool:
        return bool(value >> n & 1)

    max_leaf = regs(0)[0]
    _, _, ecx1, _ = regs(1)
    flags: set[str] = set()
    # The OS must save the wider registers on a context switch (XCR0), or the CPU's word is moot.
    xcr0 = xgetbv(0) if bit(ecx1, 27) else 0  # OSXSAVE
    avx_os = xcr0 & 0x6 == 0x6
    avx512_os = avx_os and xcr0 & 0xE0 == 0xE0
    amx_os = xcr0 & 0x60000 == 0x60000
    if avx_os:
        for name, n in (("fma", 12), ("avx", 28), ("f16c", 29)):
            if bit(ecx1, n):
                flags.add(name)
    if max_leaf >= 7:
        _, ebx7, ecx7, edx7 = regs(7, 0)
        eax71, _, _, edx71 = regs(7, 1)
        if avx_os:
            flags |= {name for name, n in (("avx2", 5),) if bit(ebx7, n)}
            flags |= {name for name, n in (("avx_vnni", 4),) if bit(eax71, n)}
            flags |= {name for name, n in (("avx_ne_convert", 5),) if bit(edx71, n)}
        if avx512_os:
            named = (("avx512f", 16), ("avx512dq", 17), ("avx512cd", 28), ("avx512bw", 30), ("avx512vl", 31))
            flags |= {name for name, n in named if bit(ebx7, n)}
            flags |= {name for name, n in (("avx512_vnni", 11),) if bit(ecx7, n)}
            flags |= {name for name, n in (("avx512_bf16", 5),) if bit(eax71, n)}
        if amx_os:
            flags |= {name for name, n in (("amx_bf16", 22), ("amx_tile", 24), ("amx_int8", 25)) if bit(edx7, n)}
    return frozenset(flags), _cpuid_brand(regs)


def _cpuid_brand(regs: Any) -> str:
    if regs(0x80000000)[0] < 0x80000004:
        return ""
    raw = b"".join(r.to_bytes(4, "little") for leaf in (0x80000002, 0x80000003, 0x80000004) for r in regs(leaf))
    return raw.split(b"\0", 1)[0].decode("ascii", "replace").strip()


# ---- /proc/cpuinfo and sysctl -----------------------------------------------------------------

_PROC_NAMES = {"avx512_bf16": "avx512_bf16", "avx_vnni": "avx_vnni", "avx512_vnni": "avx512_vnni"}


def proc_cpuinfo() -> tuple[frozenset[str], str]:
    try:
        text = open("/proc/cpuinfo").read()  # noqa: SIM115 - read once
    except OSError:
        return frozenset(), ""
    flags: set[str] = set()
    model = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
    if "amx_bf16" in flags and "amx_tile" not in flags:
        flags.discard("amx_bf16")
    return frozenset(_PROC_NAMES.get(f, f) for f in flags), model


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", name], check=False, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def arm_features() -> tuple[frozenset[str], str, str]:
    if sys.platform == "darwin":  # Apple silicon: NEON always; BF16 from M2 on
        flags = {"asimd"}
        if _sysctl("hw.optional.arm.FEAT_BF16") == "1":
            flags.add("bf16")
        return frozenset(flags), _sysctl("machdep.cpu.brand_string") or "Apple silicon", "sysctl"
    flags, model = proc_cpuinfo()
    return flags, model or platform.processor() or "ARM64", "/proc/cpuinfo"
