// The attention loops' AVX-512 routines (attention_kernels.h), for head_dim a multiple of 16 up
// to 256: the fold for any such head_dim, the in-place decode for 64 and 128 with groups 1..8 (and
// on a CPU with AVX512-BF16, bf16 caches read 16 keys at a time). Compiled for their target only
// (a function attribute) and chosen at run time from the process's tier (cpu_isa.h) by
// paged_attention_cpu.cpp's pick_kernels.
#include "attention_kernels.h"
#include "cpu_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "simd_exp.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))

namespace servelab::attn {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using servelab::exp512;

AVX512 inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1);
}

AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
AVX512 inline __m512 load16(const c10::BFloat16* p) {
  // bf16 is the top half of an fp32: widen and shift.
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
AVX512 inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <typename T>
AVX512 void load_block_avx512(const T* src, int64_t row_stride, int64_t n, int64_t D, float* dst) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(dst + j * D + d, load16(src + j * row_stride + d));
}

// Turns one row's scores s[0, n) into exp(s - m_new) in place and updates its running max and
// sum; returns alpha = exp(m_old - m_new), the factor its accumulator must be rescaled by.
AVX512 inline float softmax_step(float* s, int64_t n, float* m, float* l) {
  __m512 vmax = _mm512_set1_ps(kNegInf);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 mask = first_lanes(n - j);
    vmax = _mm512_mask_max_ps(vmax, mask, vmax, _mm512_maskz_loadu_ps(mask, s + j));
  }
  const float m_new = std::max(*m, _mm512_reduce_max_ps(vmax));
  const float alpha = std::exp(*m - m_new);  // 0 on the first block (m = -inf)
  const __m512 m_vec = _mm512_set1_ps(m_new);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 mask = first_lanes(n - j);
    const __m512 p = _mm512_maskz_mov_ps(mask, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + j), m_vec)));
    vsum = _mm512_add_ps(vsum, p);
    _mm512_mask_storeu_ps(s + j, mask, p);
  }
  *l = *l * alpha + _mm512_reduce_add_ps(vsum);
  *m = m_new;
  return alpha;
}

template <int NC>  // head_dim = 16 * NC
AVX512 void fold_avx512(const float* q, int64_t R, int64_t /*D*/, const float* k, const float* v,
                        const int64_t* visible, float* s, Rows rows) {
  constexpr int64_t D = 16 * NC;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t nv = visible[r];
    if (nv <= 0) continue;
    __m512 qr[NC];
    for (int c = 0; c < NC; ++c) qr[c] = _mm512_loadu_ps(q + r * D + 16 * c);
    for (int64_t j = 0; j < nv; ++j) {
      const float* kj = k + j * D;
      __m512 dot = _mm512_mul_ps(qr[0], _mm512_loadu_ps(kj));
      for (int c = 1; c < NC; ++c) dot = _mm512_fmadd_ps(qr[c], _mm512_loadu_ps(kj + 16 * c), dot);
      s[j] = _mm512_reduce_add_ps(dot);
    }
    const __m512 a = _mm512_set1_ps(softmax_step(s, nv, rows.m + r, rows.l + r));
    float* acc_r = rows.acc + r * D;
    __m512 acc[NC];
    for (int c = 0; c < NC; ++c) acc[c] = _mm512_mul_ps(_mm512_loadu_ps(acc_r + 16 * c), a);
    for (int64_t j = 0; j < nv; ++j) {
      const __m512 p = _mm512_set1_ps(s[j]);
      const float* vj = v + j * D;
      for (int c = 0; c < NC; ++c) acc[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 16 * c), acc[c]);
    }
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(acc_r + 16 * c, acc[c]);
  }
}

// Decode (one query token, its G heads as the rows): reads the block's K/V straight from the
// cache, each key and value row loaded and widened once for the whole group, the group's
// queries and accumulators in registers. s holds G rows of n scores.
template <typename T, int NC, int G>
AVX512 void fold_decode_avx512(const float* q, const T* /*q_raw*/, float /*scale*/, const T* k, int64_t k_row,
                               const T* v, int64_t v_row, int64_t n, float* s, Rows rows) {
  constexpr int64_t D = 16 * NC;
  __m512 qr[G][NC];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NC; ++c) qr[g][c] = _mm512_loadu_ps(q + g * D + 16 * c);
  for (int64_t j = 0; j < n; ++j) {
    __m512 kj[NC];
    for (int c = 0; c < NC; ++c) kj[c] = load16(k + j * k_row + 16 * c);
    for (int g = 0; g < G; ++g) {
      __m512 dot = _mm512_mul_ps(qr[g][0], kj[0]);
      for (int c = 1; c < NC; ++c) dot = _mm512_fmadd_ps(qr[g][c], kj[c], dot);
      s[g * n + j] = _mm512_reduce_add_ps(dot);
    }
  }
  __m512 acc[G][NC];
  for (int g = 0; g < G; ++g) {
    const __m512 a = _mm512_set1_ps(softmax_step(s + g * n, n, rows.m + g, rows.l + g));
    for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_mul_ps(_mm512_loadu_ps(rows.acc + g * D + 16 * c), a);
  }
  for (int64_t j = 0; j < n; ++j) {
    __m512 vj[NC];
    for (int c = 0; c < NC; ++c) vj[c] = load16(v + j * v_row + 16 * c);
    for (int g = 0; g < G; ++g) {
      const __m512 p = _mm512_set1_ps(s[g * n + j]);
      for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_fmadd_ps(p, vj[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(rows.acc + g * D + 16 * c, acc[g][c]);
}

// Sums each of 16 vectors across its lanes in 45 shuffles and adds (16 horizontal reductions would
// take about three times that, each a serial chain): lane 4c + i of the result is the sum of
// v[4i + c]. Callers store key k's partial at slot kSlot[k], so that lane k holds key k.
constexpr int kSlot[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

AVX512 inline __m512 sum_lanes16(const __m512* v) {
  __m512 x[8], y[4], z[2];
  for (int i = 0; i < 8; ++i)  // [A.c0+A.c2, A.c1+A.c3, B.c0+B.c2, B.c1+B.c3] by 128-bit chunk
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // one 128-bit chunk per vector
    y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // two lanes per vector
    z[i] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Decode over bf16 K/V on a CPU with AVX512-BF16, 16 keys at a time: each score is a dot product
// of the raw bf16 query and key rows by vdpbf16ps (exact products, fp32 sums), the 16 scores of a
// head reduced together, the online softmax on one vector of 16, and the weighted sum of V in fp32.
// q_raw: the group's G query rows as stored (unscaled); the scale is applied to the scores.
template <int NC, int G>  // head_dim = 16 * NC
AVX512BF16 void decode_blocked_bf16(const float* /*q*/, const c10::BFloat16* q_raw, float scale,
                                    const c10::BFloat16* k, int64_t k_row, const c10::BFloat16* v, int64_t v_row,
                                    int64_t n, float* s, Rows rows) {
  constexpr int64_t D = 16 * NC;
  constexpr int NP = NC / 2;  // 32 bf16 per register
  __m512bh qr[G][NP];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NP; ++c) qr[g][c] = (__m512bh)_mm512_loadu_si512(q_raw + g * D + 32 * c);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t nk = std::min<int64_t>(16, n - j0);
    const __mmask16 valid = first_lanes(nk);
    const c10::BFloat16* kb = k + j0 * k_row;
    float* p = s;  // G rows of 16 probabilities
    for (int g = 0; g < G; ++g) {
      __m512 part[16];
      for (int kk = 0; kk < 16; ++kk) {
        __m512 acc = _mm512_setzero_ps();
        if (kk < nk) {
          const c10::BFloat16* row = kb + kk * k_row;
          for (int c = 0; c < NP; ++c)
            acc = _mm512_dpbf16_ps(acc, qr[g][c], (__m512bh)_mm512_loadu_si512(row + 32 * c));
        }
        part[kSlot[kk]] = acc;
      }
      const __m512 score = _mm512_mask_mov_ps(_mm512_set1_ps(kNegInf), valid, _mm512_mul_ps(sum_lanes16(part), vscale));
      const float m_old = rows.m[g];
      const float m_new = std::max(m_old, _mm512_reduce_max_ps(score));
      const __m512 e = _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(score, _mm512_set1_ps(m_new))));
      const float alpha = m_new == m_old ? 1.f : std::exp(m_old - m_new);  // 0 on the first block (m = -inf)
      rows.l[g] = rows.l[g] * alpha + _mm512_reduce_add_ps(e);
      rows.m[g] = m_new;
      _mm512_storeu_ps(p + g * 16, e);
      if (alpha != 1.f) {
        const __m512 a = _mm512_set1_ps(alpha);
        for (int c = 0; c < NC; ++c)
          _mm512_storeu_ps(rows.acc + g * D + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(rows.acc + g * D + 16 * c), a));
      }
    }
    __m512 acc[G][NC];
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_loadu_ps(rows.acc + g * D + 16 * c);
    const c10::BFloat16* vb = v + j0 * v_row;
    for (int64_t j = 0; j < nk; ++j) {
      __m512 vj[NC];
      for (int c = 0; c < NC; ++c) vj[c] = load16(vb + j * v_row + 16 * c);
      for (int g = 0; g < G; ++g) {
        const __m512 pj = _mm512_set1_ps(p[g * 16 + j]);
        for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_fmadd_ps(pj, vj[c], acc[g][c]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < NC; ++c) _mm512_storeu_ps(rows.acc + g * D + 16 * c, acc[g][c]);
  }
}


template <int NC>
DecodeFn<c10::BFloat16> blocked_bf16_for_group(int64_t G) {
  switch (G) {
    case 1: return decode_blocked_bf16<NC, 1>;
    case 2: return decode_blocked_bf16<NC, 2>;
    case 3: return decode_blocked_bf16<NC, 3>;
    case 4: return decode_blocked_bf16<NC, 4>;
    case 5: return decode_blocked_bf16<NC, 5>;
    case 6: return decode_blocked_bf16<NC, 6>;
    case 7: return decode_blocked_bf16<NC, 7>;
    case 8: return decode_blocked_bf16<NC, 8>;
    default: return nullptr;
  }
}

// bf16 caches on a CPU with AVX512-BF16 and head_dim 64 or 128: the 16-keys-at-a-time decode.
template <typename T>
DecodeFn<T> blocked_decode(int64_t, int64_t, int) { return nullptr; }
template <>
DecodeFn<c10::BFloat16> blocked_decode<c10::BFloat16>(int64_t D, int64_t G, int isa) {
  if (isa < servelab::kAvx512Bf16) return nullptr;
  return D == 64 ? blocked_bf16_for_group<4>(G) : D == 128 ? blocked_bf16_for_group<8>(G) : nullptr;
}

template <typename T, int NC>
DecodeFn<T> decode_for_group(int64_t G) {
  switch (G) {
    case 1: return fold_decode_avx512<T, NC, 1>;
    case 2: return fold_decode_avx512<T, NC, 2>;
    case 3: return fold_decode_avx512<T, NC, 3>;
    case 4: return fold_decode_avx512<T, NC, 4>;
    case 5: return fold_decode_avx512<T, NC, 5>;
    case 6: return fold_decode_avx512<T, NC, 6>;
    case 7: return fold_decode_avx512<T, NC, 7>;
    case 8: return fold_decode_avx512<T, NC, 8>;
    default: return nullptr;
  }
}

}  // namespace

template <typename T>
Kernels<T> avx512_kernels(int64_t D, int64_t G, int isa) {
  static constexpr FoldFn folds[] = {fold_avx512<1>,  fold_avx512<2>,  fold_avx512<3>,  fold_avx512<4>,
                                     fold_avx512<5>,  fold_avx512<6>,  fold_avx512<7>,  fold_avx512<8>,
                                     fold_avx512<9>,  fold_avx512<10>, fold_avx512<11>, fold_avx512<12>,
                                     fold_avx512<13>, fold_avx512<14>, fold_avx512<15>, fold_avx512<16>};
  // The common head sizes (64, 128) get the register-resident decode path.
  DecodeFn<T> decode = blocked_decode<T>(D, G, isa);
  if (decode == nullptr) decode = D == 64 ? decode_for_group<T, 4>(G) : D == 128 ? decode_for_group<T, 8>(G) : nullptr;
  return {load_block_avx512<T>, folds[D / 16 - 1], decode};
}

template Kernels<float> avx512_kernels<float>(int64_t, int64_t, int);
template Kernels<c10::BFloat16> avx512_kernels<c10::BFloat16>(int64_t, int64_t, int);
template Kernels<c10::Half> avx512_kernels<c10::Half>(int64_t, int64_t, int);

}  // namespace servelab::attn

#endif  // __x86_64__
