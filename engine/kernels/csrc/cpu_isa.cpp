// The op's one capability probe (cpu_isa.h), kept in step with engine/platform/machine.py's tiers.

#include "cpu_isa.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1 << 14)
#endif
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

namespace servelab {
namespace {

#if defined(__x86_64__)
constexpr const char* kNames[] = {"scalar", "avx2", "avx512", "avx512_bf16", "amx"};
#elif defined(__aarch64__)
constexpr const char* kNames[] = {"scalar", "neon", "neon_bf16"};
#else
constexpr const char* kNames[] = {"scalar"};
#endif
constexpr int kTiers = sizeof(kNames) / sizeof(kNames[0]);

int detect() {
#if defined(__x86_64__)
  // __builtin_cpu_supports counts AVX and AVX-512 only where the OS saves their registers (XCR0).
  if (!(__builtin_cpu_supports("avx") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")))
    return kScalar;
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")))
    return kAvx2;
  if (!__builtin_cpu_supports("avx512bf16")) return kAvx512;
  // AMX from CPUID itself (leaf 7: EDX bit 24 tiles, bit 22 bf16), and the OS's XCR0 bits 17-18
  // for the tile state, as engine/platform/machine.py reads them.
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return kAvx512Bf16;
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  asm volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));  // OSXSAVE: implied by AVX above
  return (xcr0_lo & 0x60000u) == 0x60000u ? kAmx : kAvx512Bf16;
#elif defined(__aarch64__) && defined(__linux__)
  // The kernel's hwcaps are what /proc/cpuinfo's Features line (machine.py's source) prints.
  if (!(getauxval(AT_HWCAP) & HWCAP_ASIMD)) return kScalar;
  return getauxval(AT_HWCAP2) & HWCAP2_BF16 ? kNeonBf16 : kNeon;
#elif defined(__aarch64__) && defined(__APPLE__)
  int bf16 = 0;
  size_t len = sizeof(bf16);
  const bool has = sysctlbyname("hw.optional.arm.FEAT_BF16", &bf16, &len, nullptr, 0) == 0 && bf16 == 1;
  return has ? kNeonBf16 : kNeon;
#else
  return kScalar;
#endif
}

}  // namespace

int hardware_isa() {
  static const int isa = detect();
  return isa;
}

int cpu_isa() {
  // Read once: a static that throws (an unknown name) is tried again by the next call, and raises again.
  static const int isa = []() -> int {
    const char* cap = std::getenv("SERVELAB_CPU_ISA");
    if (cap == nullptr || *cap == '\0') return hardware_isa();
    for (int i = 0; i < kTiers; ++i)
      if (std::strcmp(cap, kNames[i]) == 0) return std::min(hardware_isa(), i);
    std::string known;
    for (int i = 0; i < kTiers; ++i) known += std::string(i ? ", " : "") + kNames[i];
    TORCH_CHECK(false, "SERVELAB_CPU_ISA=", cap, ": this build's tiers are ", known);
    return kScalar;
  }();
  return isa;
}

int isa_cap(int64_t requested) {
  const int isa = cpu_isa();
  return requested < 0 ? isa : static_cast<int>(std::min<int64_t>(isa, requested));
}

const char* isa_name(int isa) { return kNames[std::clamp(isa, 0, kTiers - 1)]; }

}  // namespace servelab
