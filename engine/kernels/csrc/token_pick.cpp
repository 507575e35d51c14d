// Each row's next token from a step's logits, read in their own dtype (bf16 or fp32), one row per
// thread at a time, 16 values per instruction.
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
#include "paged_attention_loops.h"
#include "simd_exp.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define PICK_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
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
#endif

template <typename T>
void pick_rows(const at::Tensor& logits, int64_t* out) {
  const int64_t rows = logits.size(0), n = logits.size(1), stride = logits.stride(0);
  const T* data = logits.data_ptr<T>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
#if defined(__x86_64__)
      if (has_avx512() && n < INT32_MAX) {
        out[r] = pick_avx512(data + r * stride, n);
        continue;
      }
#endif
      out[r] = pick_scalar(data + r * stride, n);
    }
  });
}

template <typename T>
void sample_rows(const at::Tensor& logits, const float* inv_t, const double* u, bool simd, int64_t* out) {
  const int64_t rows = logits.size(0), n = logits.size(1), stride = logits.stride(0);
  const T* data = logits.data_ptr<T>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> weights(n + 16);  // this thread's scratch: one row's exp weights
    for (int64_t r = begin; r < end; ++r) {
#if defined(__x86_64__)
      if (simd && has_avx512()) {
        out[r] = sample_avx512(data + r * stride, n, inv_t[r], u[r], weights.data());
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

at::Tensor greedy_pick(const at::Tensor& logits) {
  check_logits(logits, "greedy_pick");
  at::Tensor out = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  if (logits.scalar_type() == at::kFloat)
    pick_rows<float>(logits, out.data_ptr<int64_t>());
  else
    pick_rows<c10::BFloat16>(logits, out.data_ptr<int64_t>());
  return out;
}

at::Tensor sample_pick(const at::Tensor& logits, const at::Tensor& inv_temperature, const at::Tensor& uniforms,
                       bool simd) {
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
  if (logits.scalar_type() == at::kFloat)
    sample_rows<float>(logits, inv_t, u, simd, out.data_ptr<int64_t>());
  else
    sample_rows<c10::BFloat16>(logits, inv_t, u, simd, out.data_ptr<int64_t>());
  return out;
}

}  // namespace servelab
