// Each row's next token from a step's logits, read in their own dtype (bf16 or fp32), one row per
// thread at a time, 16 values per instruction (AVX-512) or 8 (AVX2), by the process's tier
// (cpu_isa.h), else one at a time.
//
// The greedy pick is the row's argmax with torch.max(dim)'s answer: the first of tied maxima, and
// the first NaN if any. torch's max(dim) tracks indices serially (about 3 ms of a batch-64 step
// here, plus 1.4 ms to widen bf16 logits to fp32 first).
//
// The sampled pick inverts the row's CDF at one uniform draw: the first token whose running sum of
// exp((l - max) / T) passes u times the total. One draw per row lets a seeded request own its
// randomness whatever shares its batch; the exponential race it replaced (one torch exponential_
// per row) took 65 ms of a batch-64 step here, this 0.8 ms (bench/sampler_bench.py).

#include "token_pick.h"
#include "cpu_isa.h"
#include "simd_exp.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define PICK_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define PICK_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

namespace servelab {
namespace {

template <typename T>
int64_t pick_scalar(const T* row, int64_t n) {
  int64_t best = 0;
  float best_value = static_cast<float>(row[0]);
  if (std::isnan(best_value)) return 0;
  for (int64_t i = 1; i < n; ++i) {
    const float v = static_cast<float>(row[i]);
    if (std::isnan(v)) return i;
    if (v > best_value) best_value = v, best = i;
  }
  return best;
}

// ---- the sampled pick's shared steps ---------------------------------------------------------

// The first index whose running sum of e passes target (e >= 0), or -1 if none does.
int64_t invert_cdf(const float* e, int64_t n, double target) {
  double running = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (e[i] <= 0.f) continue;
    running += e[i];
    if (running > target) return i;
  }
  return -1;
}

int64_t last_weighted(const float* e, int64_t n) {
  for (int64_t i = n - 1; i > 0; --i)
    if (e[i] > 0.f) return i;
  return 0;
}

template <typename T>
int64_t sample_scalar(const T* row, int64_t n, float inv_t, double u, float* e) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(row[i]);
    if (std::isnan(v)) return i;
    top = v > top ? v : top;
  }
  if (top == -std::numeric_limits<float>::infinity()) return 0;  // nothing allowed: the greedy answer
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(row[i]);
    e[i] = v == -std::numeric_limits<float>::infinity() ? 0.f : std::exp((v - top) * inv_t);
    total += e[i];
  }
  const int64_t i = invert_cdf(e, n, u * total);
  return i >= 0 ? i : last_weighted(e, n);
}

#if defined(__x86_64__)
PICK_AVX512 inline __mmask16 lanes(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}
PICK_AVX512 inline __m512 load16(const float* p, __mmask16 m) {
  return _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), m, p);
}
PICK_AVX512 inline __m512 load16(const c10::BFloat16* p, __mmask16 m) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  return _mm512_mask_mov_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), m, v);
}

// Each lane keeps the first index of its own maximum (it moves only on a strictly greater
// value); the row's answer is the smallest index among the lanes that hold the overall maximum.
template <typename T>
PICK_AVX512 int64_t pick_avx512(const T* row, int64_t n) {
  __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512i best_at = _mm512_setzero_si512();
  __m512i at = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i step = _mm512_set1_epi32(16);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 v = load16(row + i, m);
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) return i + pick_scalar(row + i, n - i < 16 ? n - i : 16);
    const __mmask16 greater = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, greater, v);
    best_at = _mm512_mask_mov_epi32(best_at, greater, at);
    at = _mm512_add_epi32(at, step);
  }
  const float top = _mm512_reduce_max_ps(best);
  const __mmask16 holders = _mm512_cmp_ps_mask(best, _mm512_set1_ps(top), _CMP_EQ_OQ);
  const __m512i candidates = _mm512_mask_mov_epi32(_mm512_set1_epi32(INT32_MAX), holders, best_at);
  return _mm512_reduce_min_epi32(candidates);
}

// Three passes over one row: the max (and any NaN), the weights into e with their total, and the
// walk, 16 weights at a time until the running sum would pass u times the total.
template <typename T>
PICK_AVX512 int64_t sample_avx512(const T* row, int64_t n, float inv_t, double u, float* e) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 best = neg_inf;
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = load16(row + i, lanes(n - i));
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) return i + pick_scalar(row + i, n - i < 16 ? n - i : 16);
    best = _mm512_max_ps(best, v);
  }
  const float top = _mm512_reduce_max_ps(best);
  if (top == -std::numeric_limits<float>::infinity()) return 0;  // nothing allowed: the greedy answer
  const __m512 top_v = _mm512_set1_ps(top), scale = _mm512_set1_ps(inv_t);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    const __m512 v = load16(row + i, m);
    // exp512 clamps its argument, so a masked-out (-inf) logit is zeroed by the mask, not by exp.
    const __mmask16 live = m & _mm512_cmp_ps_mask(v, neg_inf, _CMP_NEQ_OQ);
    const __m512 w = _mm512_maskz_mov_ps(live, exp512(_mm512_mul_ps(_mm512_sub_ps(v, top_v), scale)));
    _mm512_mask_storeu_ps(e + i, m, w);
    sum = _mm512_add_ps(sum, w);
  }
  const double target = u * static_cast<double>(_mm512_reduce_add_ps(sum));
  double running = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const double chunk = _mm512_reduce_add_ps(_mm512_loadu_ps(e + i));
    if (running + chunk > target) break;
    running += chunk;
  }
  if (i < n) {
    const int64_t j = invert_cdf(e + i, n - i, target - running);
    if (j >= 0) return i + j;
  }
  return last_weighted(e, n);  // rounding left the running sum a hair under the target
}

// ---- AVX2: the same three steps, 8 lanes -----------------------------------------------------

constexpr int32_t kTailBits[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

// Eight logits from p, -inf from lane `left` on (a row's tail is never read past its end).
PICK_AVX2 inline __m256 load8(const float* p, int64_t left) {
  if (left >= 8) return _mm256_loadu_ps(p);
  const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTailBits + 8 - left));
  return _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()), _mm256_maskload_ps(p, m),
                          _mm256_castsi256_ps(m));
}
PICK_AVX2 inline __m256 load8(const c10::BFloat16* p, int64_t left) {
  uint16_t tail[8];
  const void* src = p;
  if (left < 8) {
    for (uint16_t& t : tail) t = 0xFF80;  // bf16 -inf
    std::memcpy(tail, p, left * sizeof(uint16_t));
    src = tail;
  }
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(src)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

PICK_AVX2 inline bool any_nan(__m256 v) { return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0; }

PICK_AVX2 inline float max8(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

PICK_AVX2 inline float sum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

PICK_AVX2 inline int32_t min8_epi32(__m256i v) {
  __m128i x = _mm_min_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_min_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm_min_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(x);
}

// As pick_avx512: each lane keeps the first index of its own maximum, the answer is the smallest
// index among the lanes holding the overall one.
template <typename T>
PICK_AVX2 int64_t pick_avx2(const T* row, int64_t n) {
  __m256 best = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256i best_at = _mm256_setzero_si256();
  __m256i at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i step = _mm256_set1_epi32(8);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = load8(row + i, n - i);
    if (any_nan(v)) return i + pick_scalar(row + i, n - i < 8 ? n - i : 8);
    const __m256 greater = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, v, greater);
    best_at = _mm256_blendv_epi8(best_at, at, _mm256_castps_si256(greater));
    at = _mm256_add_epi32(at, step);
  }
  const __m256 holders = _mm256_cmp_ps(best, _mm256_set1_ps(max8(best)), _CMP_EQ_OQ);
  return min8_epi32(_mm256_blendv_epi8(_mm256_set1_epi32(INT32_MAX), best_at, _mm256_castps_si256(holders)));
}

template <typename T>
PICK_AVX2 int64_t sample_avx2(const T* row, int64_t n, float inv_t, double u, float* e) {
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 best = neg_inf;
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = load8(row + i, n - i);
    if (any_nan(v)) return i + pick_scalar(row + i, n - i < 8 ? n - i : 8);
    best = _mm256_max_ps(best, v);
  }
  const float top = max8(best);
  if (top == -std::numeric_limits<float>::infinity()) return 0;  // nothing allowed: the greedy answer
  const __m256 top_v = _mm256_set1_ps(top), scale = _mm256_set1_ps(inv_t);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = load8(row + i, n - i);  // -inf past the row: weight 0 in e's spare tail
    // exp256 clamps its argument, so a -inf logit is zeroed by the mask, not by exp.
    const __m256 live = _mm256_cmp_ps(v, neg_inf, _CMP_NEQ_OQ);
    const __m256 w = _mm256_and_ps(exp256(_mm256_mul_ps(_mm256_sub_ps(v, top_v), scale)), live);
    _mm256_storeu_ps(e + i, w);
    sum = _mm256_add_ps(sum, w);
  }
  const double target = u * static_cast<double>(sum8(sum));
  double running = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const double chunk = sum8(_mm256_loadu_ps(e + i));
    if (running + chunk > target) break;
    running += chunk;
  }
  if (i < n) {
    const int64_t j = invert_cdf(e + i, n - i, target - running);
    if (j >= 0) return i + j;
  }
  return last_weighted(e, n);  // rounding left the running sum a hair under the target
}
#endif

// isa: the tier whose routines may run (cpu_isa.h), already capped.
template <typename T>
void pick_rows(const at::Tensor& logits, int isa, int64_t* out) {
  const int64_t rows = logits.size(0), n = logits.size(1), stride = logits.stride(0);
  const T* data = logits.data_ptr<T>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
#if defined(__x86_64__)
      if (isa >= kAvx512 && n < INT32_MAX) {
        out[r] = pick_avx512(data + r * stride, n);
        continue;
      }
      if (isa >= kAvx2 && n < INT32_MAX) {
        out[r] = pick_avx2(data + r * stride, n);
        continue;
      }
#endif
      out[r] = pick_scalar(data + r * stride, n);
    }
  });
}

template <typename T>
void sample_rows(const at::Tensor& logits, const float* inv_t, const double* u, int isa, int64_t* out) {
  const int64_t rows = logits.size(0), n = logits.size(1), stride = logits.stride(0);
  const T* data = logits.data_ptr<T>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> weights(n + 16);  // this thread's scratch: one row's exp weights
    for (int64_t r = begin; r < end; ++r) {
#if defined(__x86_64__)
      if (isa >= kAvx512) {
        out[r] = sample_avx512(data + r * stride, n, inv_t[r], u[r], weights.data());
        continue;
      }
      if (isa >= kAvx2) {
        out[r] = sample_avx2(data + r * stride, n, inv_t[r], u[r], weights.data());
        continue;
      }
#endif
      out[r] = sample_scalar(data + r * stride, n, inv_t[r], u[r], weights.data());
    }
  });
}

void check_logits(const at::Tensor& logits, const char* op) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.stride(1) == 1 && logits.size(1) > 0, op,
              ": CPU logits [B, V] with contiguous rows");
  TORCH_CHECK(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16, op,
              ": float32 or bfloat16 logits, got ", logits.scalar_type());
}

}  // namespace

at::Tensor greedy_pick(const at::Tensor& logits, int64_t isa) {
  check_logits(logits, "greedy_pick");
  at::Tensor out = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  const int tier = isa_cap(isa);
  if (logits.scalar_type() == at::kFloat)
    pick_rows<float>(logits, tier, out.data_ptr<int64_t>());
  else
    pick_rows<c10::BFloat16>(logits, tier, out.data_ptr<int64_t>());
  return out;
}

at::Tensor sample_pick(const at::Tensor& logits, const at::Tensor& inv_temperature, const at::Tensor& uniforms,
                       int64_t isa) {
  check_logits(logits, "sample_pick");
  const int64_t rows = logits.size(0);
  TORCH_CHECK(inv_temperature.scalar_type() == at::kFloat && inv_temperature.dim() == 1 &&
                  inv_temperature.size(0) == rows && inv_temperature.is_contiguous(),
              "sample_pick: inv_temperature is float32 [B]");
  TORCH_CHECK(uniforms.scalar_type() == at::kDouble && uniforms.dim() == 1 && uniforms.size(0) == rows &&
                  uniforms.is_contiguous(),
              "sample_pick: uniforms is float64 [B]");
  at::Tensor out = at::empty({rows}, logits.options().dtype(at::kLong));
  const float* inv_t = inv_temperature.data_ptr<float>();
  const double* u = uniforms.data_ptr<double>();
  const int tier = isa_cap(isa);
  if (logits.scalar_type() == at::kFloat)
    sample_rows<float>(logits, inv_t, u, tier, out.data_ptr<int64_t>());
  else
    sample_rows<c10::BFloat16>(logits, inv_t, u, tier, out.data_ptr<int64_t>());
  return out;
}

}  // namespace servelab
