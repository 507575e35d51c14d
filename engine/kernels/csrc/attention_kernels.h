// The attention loops' per-block routines (paged_attention_cpu.cpp runs them, one family per
// ISA): what each takes, and the AVX2 and AVX-512 families' entries (attention_avx2.cpp,
// attention_avx512.cpp).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace servelab::attn {

// The online-softmax state of R query rows: running max m, running sum l, unnormalised acc [R][D].
struct Rows {
  float* m;
  float* l;
  float* acc;
};

// Folds keys [0, n) of one block (fp32 rows of D) into each row's state; row r sees keys
// [0, visible[r]). scores: scratch of at least n + 16 floats.
using FoldFn = void (*)(const float* q, int64_t R, int64_t D, const float* k, const float* v, const int64_t* visible,
                        float* scores, Rows rows);

// Widens n rows (row_stride apart) of a block of K or V into dst [n][D] fp32.
template <typename T>
using LoadFn = void (*)(const T* src, int64_t row_stride, int64_t n, int64_t D, float* dst);

// A decode's G rows over one block, read in place: (q scaled in fp32, q as stored, scale, K block,
// K row stride, V block, V row stride, keys, scratch of G * (n + 16) floats, rows).
template <typename T>
using DecodeFn = void (*)(const float*, const T*, float, const T*, int64_t, const T*, int64_t, int64_t, float*, Rows);

template <typename T>
struct Kernels {
  LoadFn<T> load;
  FoldFn fold;
  DecodeFn<T> decode;  // null: decodes go through load + fold too
};

#if defined(__x86_64__)
// AVX2 + FMA + F16C routines, for head_dim a multiple of 8 (the caller checks the CPU's tier):
// the fold for any such head_dim, the in-place decode for 64 and 128 with groups 1..8.
template <typename T>
Kernels<T> avx2_kernels(int64_t D, int64_t G);

// AVX-512 routines (attention_avx512.cpp), for head_dim a multiple of 16 up to 256: the fold for
// any such head_dim, the in-place decode for 64 and 128 with groups 1..8; bf16 caches on a CPU
// with AVX512-BF16 (isa, the capped tier) read 16 keys at a time.
template <typename T>
Kernels<T> avx512_kernels(int64_t D, int64_t G, int isa);
#endif

}  // namespace servelab::attn
