// The attention loops' AVX2 + FMA routines (attention_kernels.h), for CPUs between the scalar
// fallback and AVX-512 (AMD Zen 1-3, Intel's cores without AVX-512): 8 fp32 lanes and only 16
// ymm registers, so unlike the AVX-512 routines nothing keeps a whole group's queries or
// accumulators in registers; the decode works in passes of a few rows by a few columns instead.
// Compiled for that target alone (a function attribute); paged_attention_cpu.cpp picks them from
// the process's tier (cpu_isa.h).

#include "attention_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "simd_exp.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

namespace servelab::attn {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Lanes [0, left) of a vector: an 8-int window of this table.
constexpr int32_t kTailBits[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

AVX2 inline __m256 tail_mask(int64_t left) {
  return _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTailBits + 8 - left)));
}

AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
AVX2 inline __m256 load8(const c10::BFloat16* p) {
  // bf16 is the top half of an fp32: widen and shift.
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
AVX2 inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

AVX2 inline float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

AVX2 inline float hmax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

// Lane k of the result is the sum of v[k]'s lanes: eight horizontal sums in 9 shuffles and adds
// (one at a time they take about 40).
AVX2 inline __m256 sum_lanes8(const __m256* v) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

template <typename T>
AVX2 void load_block_avx2(const T* src, int64_t row_stride, int64_t n, int64_t D, float* dst) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(dst + j * D + d, load8(src + j * row_stride + d));
}

// Turns one row's scores s[0, n) into exp(s - m_new) in place and updates its running max and
// sum; returns alpha = exp(m_old - m_new). s has room for whole vectors past n (scratch).
AVX2 float softmax_step(float* s, int64_t n, float* m, float* l) {
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  __m256 vmax = neg_inf;
  for (int64_t j = 0; j < n; j += 8)
    vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(s + j), tail_mask(std::min<int64_t>(8, n - j))));
  const float m_new = std::max(*m, hmax(vmax));
  const float alpha = std::exp(*m - m_new);  // 0 on the first block (m = -inf)
  const __m256 m_vec = _mm256_set1_ps(m_new);
  __m256 vsum = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 live = tail_mask(std::min<int64_t>(8, n - j));
    const __m256 p = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), m_vec)), live);
    vsum = _mm256_add_ps(vsum, p);
    _mm256_storeu_ps(s + j, p);
  }
  *l = *l * alpha + hsum(vsum);
  *m = m_new;
  return alpha;
}

// acc[0, 8W) = acc * alpha + sum_j p[j] * v[j][0, 8W), in registers over all n keys.
template <int W>
AVX2 void pv_block(const float* p, int64_t n, const float* v, int64_t v_row, float alpha, float* acc) {
  __m256 x[W];
  const __m256 a = _mm256_set1_ps(alpha);
  for (int c = 0; c < W; ++c) x[c] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * c), a);
  for (int64_t j = 0; j < n; ++j) {
    const __m256 pj = _mm256_broadcast_ss(p + j);
    for (int c = 0; c < W; ++c) x[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + j * v_row + 8 * c), x[c]);
  }
  for (int c = 0; c < W; ++c) _mm256_storeu_ps(acc + 8 * c, x[c]);
}

// The fold over fp32 blocks, any head_dim a multiple of 8: per row, eight keys' scores at a
// time, the softmax step, then the weighted sum of V in column blocks of 64 held in registers.
AVX2 void fold_avx2(const float* q, int64_t R, int64_t D, const float* k, const float* v, const int64_t* visible,
                    float* s, Rows rows) {
  for (int64_t r = 0; r < R; ++r) {
    const int64_t nv = visible[r];
    if (nv <= 0) continue;
    const float* qr = q + r * D;
    for (int64_t j0 = 0; j0 < nv; j0 += 8) {
      const float* kr[8];
      for (int i = 0; i < 8; ++i) kr[i] = k + std::min<int64_t>(j0 + i, nv - 1) * D;  // a tail repeats its last key
      __m256 dot[8];
      for (int i = 0; i < 8; ++i) dot[i] = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 qd = _mm256_loadu_ps(qr + d);
        for (int i = 0; i < 8; ++i) dot[i] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kr[i] + d), dot[i]);
      }
      _mm256_storeu_ps(s + j0, sum_lanes8(dot));
    }
    const float alpha = softmax_step(s, nv, rows.m + r, rows.l + r);
    float* acc = rows.acc + r * D;
    int64_t c0 = 0;
    for (; c0 + 64 <= D; c0 += 64) pv_block<8>(s, nv, v + c0, D, alpha, acc + c0);
    switch ((D - c0) / 8) {
      case 1: pv_block<1>(s, nv, v + c0, D, alpha, acc + c0); break;
      case 2: pv_block<2>(s, nv, v + c0, D, alpha, acc + c0); break;
      case 3: pv_block<3>(s, nv, v + c0, D, alpha, acc + c0); break;
      case 4: pv_block<4>(s, nv, v + c0, D, alpha, acc + c0); break;
      case 5: pv_block<5>(s, nv, v + c0, D, alpha, acc + c0); break;
      case 6: pv_block<6>(s, nv, v + c0, D, alpha, acc + c0); break;
      case 7: pv_block<7>(s, nv, v + c0, D, alpha, acc + c0); break;
      default: break;
    }
  }
}

// One pass of the decode's weighted sum: P rows by W vectors of columns, in registers over all n
// keys (P * W accumulators, P broadcast weights and the widened V vector: at most 13 of the 16
// ymm registers), each V vector widened once for the pass's P rows. The loops over r and c are
// unrolled by pragma: left to GCC 12, the 3- and 4-row tiles kept their accumulators in registers
// but also stored all of them to the stack on every key.
#define UNROLL _Pragma("GCC unroll 8")
template <typename T, int P, int W>
AVX2 void pv_tile(const float* p, int64_t p_row, int64_t n, const T* v, int64_t v_row, const float* alpha, float* acc,
                  int64_t D) {
  __m256 x[P][W];
  UNROLL for (int r = 0; r < P; ++r) {
    const __m256 a = _mm256_set1_ps(alpha[r]);
    UNROLL for (int c = 0; c < W; ++c) x[r][c] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * D + 8 * c), a);
  }
  for (int64_t j = 0; j < n; ++j) {
    __m256 pj[P];
    UNROLL for (int r = 0; r < P; ++r) pj[r] = _mm256_broadcast_ss(p + r * p_row + j);
    UNROLL for (int c = 0; c < W; ++c) {
      const __m256 vc = load8(v + j * v_row + 8 * c);
      UNROLL for (int r = 0; r < P; ++r) x[r][c] = _mm256_fmadd_ps(pj[r], vc, x[r][c]);
    }
  }
  UNROLL for (int r = 0; r < P; ++r) {
    UNROLL for (int c = 0; c < W; ++c) _mm256_storeu_ps(acc + r * D + 8 * c, x[r][c]);
  }
}

template <typename T, int NC, int P>
AVX2 inline void pv_rows(const float* p, int64_t p_row, int64_t n, const T* v, int64_t v_row, const float* alpha,
                         float* acc) {
  constexpr int W = P == 1 ? 8 : P == 2 ? 4 : 2;  // P * W + P + 1 <= 13 registers
  for (int c0 = 0; c0 < NC; c0 += W) pv_tile<T, P, W>(p, p_row, n, v + 8 * c0, v_row, alpha, acc + 8 * c0, 8 * NC);
}

// Decode (one query token, its G heads as the rows) over K/V read straight from the cache: each
// key row is widened once for the whole group (G dot products of 8 lanes in registers, the queries
// read from L1), eight keys' partial sums reduced together; then each row's softmax step; then the
// weighted sum of V in passes of at most 4 rows.
template <typename T, int NC, int G>  // head_dim = 8 * NC
AVX2 void decode_avx2(const float* q, const T* /*q_raw*/, float /*scale*/, const T* k, int64_t k_row, const T* v,
                      int64_t v_row, int64_t n, float* s, Rows rows) {
  constexpr int64_t D = 8 * NC;
  const int64_t ns = (n + 7) & ~int64_t{7};  // a row of scores, padded to whole vectors
  for (int64_t j0 = 0; j0 < n; j0 += 8) {
    const int64_t nk = std::min<int64_t>(8, n - j0);
    __m256 part[G][8];
    for (int64_t i = 0; i < 8; ++i) {
      if (i >= nk) {
        for (int g = 0; g < G; ++g) part[g][i] = _mm256_setzero_ps();
        continue;
      }
      const T* kj = k + (j0 + i) * k_row;
      __m256 dot[G];
      for (int g = 0; g < G; ++g) dot[g] = _mm256_setzero_ps();
      for (int c = 0; c < NC; ++c) {
        const __m256 kc = load8(kj + 8 * c);
        for (int g = 0; g < G; ++g) dot[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * D + 8 * c), kc, dot[g]);
      }
      for (int g = 0; g < G; ++g) part[g][i] = dot[g];
    }
    for (int g = 0; g < G; ++g) _mm256_storeu_ps(s + g * ns + j0, sum_lanes8(part[g]));
  }
  float alpha[G];
  for (int g = 0; g < G; ++g) alpha[g] = softmax_step(s + g * ns, n, rows.m + g, rows.l + g);
  constexpr int kPasses = (G + 3) / 4;
  constexpr int kFirst = (G + kPasses - 1) / kPasses;  // 5 rows: 3 + 2, 8: 4 + 4
  pv_rows<T, NC, kFirst>(s, ns, n, v, v_row, alpha, rows.acc);
  if constexpr (G > kFirst)
    pv_rows<T, NC, G - kFirst>(s + kFirst * ns, ns, n, v, v_row, alpha + kFirst, rows.acc + kFirst * D);
}

template <typename T, int NC>
DecodeFn<T> decode_for_group(int64_t G) {
  switch (G) {
    case 1: return decode_avx2<T, NC, 1>;
    case 2: return decode_avx2<T, NC, 2>;
    case 3: return decode_avx2<T, NC, 3>;
    case 4: return decode_avx2<T, NC, 4>;
    case 5: return decode_avx2<T, NC, 5>;
    case 6: return decode_avx2<T, NC, 6>;
    case 7: return decode_avx2<T, NC, 7>;
    case 8: return decode_avx2<T, NC, 8>;
    default: return nullptr;
  }
}

}  // namespace

template <typename T>
Kernels<T> avx2_kernels(int64_t D, int64_t G) {
  DecodeFn<T> decode = D == 64 ? decode_for_group<T, 8>(G) : D == 128 ? decode_for_group<T, 16>(G) : nullptr;
  return {load_block_avx2<T>, fold_avx2, decode};
}

template Kernels<float> avx2_kernels<float>(int64_t, int64_t);
template Kernels<c10::BFloat16> avx2_kernels<c10::BFloat16>(int64_t, int64_t);
template Kernels<c10::Half> avx2_kernels<c10::Half>(int64_t, int64_t);

}  // namespace servelab::attn

#endif  // __x86_64__
