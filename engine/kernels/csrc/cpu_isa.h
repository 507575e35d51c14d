// Which of the op's routine families this process may run: the CPU's tier, as engine/platform/machine.py
// names and orders them, capped by SERVELAB_CPU_ISA (so tests and benchmarks on a big CPU run
// exactly what a smaller one would). Every runtime choice of routines in the op reads it.
#pragma once

#include <cstdint>

namespace servelab {

// A tier is its index in engine/platform/machine.py's X86_TIERS or ARM_TIERS (each ISA has the lower ones).
enum Isa : int {
  kScalar = 0,
  kAvx2 = 1,        // AVX2, FMA, F16C
  kAvx512 = 2,      // AVX-512 F, BW, VL, DQ
  kAvx512Bf16 = 3,  // + AVX512-BF16
  kAmx = 4,         // + AMX-TILE, AMX-BF16 (the OS's permission is asked separately)
  kNeon = 1,        // ARM64: Advanced SIMD
  kNeonBf16 = 2,    // + BF16
};

// The hardware's tier (x86-64: __builtin_cpu_supports and CPUID; ARM64: the OS's hwcaps).
int hardware_isa();

// The hardware's tier capped by SERVELAB_CPU_ISA; a cap above the hardware is the hardware's.
// An unknown name raises (engine/platform/machine.py refuses it before the op loads).
int cpu_isa();

// The tier an op call runs: cpu_isa(), or below it when the caller caps it (requested >= 0).
int isa_cap(int64_t requested);

// The tier's name in engine/platform/machine.py ("avx2", "neon", ...).
const char* isa_name(int isa);

}  // namespace servelab
