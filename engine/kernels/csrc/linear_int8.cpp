// W8A8 linear: activations quantized per token (row) to int8 on the fly, weights int8 per output
// channel, prepacked by oneDNN (onednn::qlinear_prepack); the int32 products scaled back to the
// activation's dtype. oneDNN takes unsigned activations on x86 (u8 x s8 is what VNNI and AMX-INT8
// multiply; s8 x s8 fell to a reference loop, 100x slower), so a token's int8 values go in shifted
// by 128 with zero point 128. Per-token scales are not a oneDNN input here: the GEMM runs at scale
// 1 with the weights' per-channel scales and each output row is multiplied by its token's scale.

#include "linear_int8.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace servelab {

namespace {

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

AVX512 float row_amax_avx512(const float* x, int64_t K) {
  __m512 m = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
  float amax = _mm512_reduce_max_ps(m);
  for (; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  return amax;
}

// 16 floats * inv, rounded to nearest (even), clamped to +-127, + 128, as u8.
AVX512 void quantize_avx512(const float* x, int64_t K, float inv, uint8_t* q) {
  const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  const __m512i shift = _mm512_set1_epi32(128);
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 v = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(_mm512_loadu_ps(x + k), vinv)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(v), shift)));
  }
  for (; k < K; ++k) q[k] = static_cast<uint8_t>(std::nearbyint(std::min(127.f, std::max(-127.f, x[k] * inv))) + 128);
}

AVX2 float row_amax_avx2(const float* x, int64_t K) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 m = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float amax = *std::max_element(lanes, lanes + 8);
  for (; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  return amax;
}

// 8 floats * inv, rounded, clamped to +-127, + 128, as int32.
AVX2 inline __m256i quantize8(const float* x, __m256 inv) {
  const __m256 v = _mm256_min_ps(_mm256_set1_ps(127.f), _mm256_max_ps(_mm256_set1_ps(-127.f), _mm256_mul_ps(_mm256_loadu_ps(x), inv)));
  return _mm256_add_epi32(_mm256_cvtps_epi32(v), _mm256_set1_epi32(128));
}

AVX2 void quantize_avx2(const float* x, int64_t K, float inv, uint8_t* q) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {  // 4 x 8 int32 in 0..255 -> 32 u8, packs work per 128-bit lane
    __m256i ab = _mm256_packus_epi32(quantize8(x + k, vinv), quantize8(x + k + 8, vinv));
    __m256i cd = _mm256_packus_epi32(quantize8(x + k + 16, vinv), quantize8(x + k + 24, vinv));
    __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), bytes);
  }
  for (; k < K; ++k) q[k] = static_cast<uint8_t>(std::nearbyint(std::min(127.f, std::max(-127.f, x[k] * inv))) + 128);
}
#endif

float row_amax(const float* x, int64_t K, int isa) {
#if defined(__x86_64__)
  if (isa >= kAvx512) return row_amax_avx512(x, K);
  if (isa >= kAvx2) return row_amax_avx2(x, K);
#endif
  float amax = 0.f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  return amax;
}

void quantize(const float* x, int64_t K, float inv, uint8_t* q, int isa) {
#if defined(__x86_64__)
  if (isa >= kAvx512) return quantize_avx512(x, K, inv, q);
  if (isa >= kAvx2) return quantize_avx2(x, K, inv, q);
#endif
  for (int64_t k = 0; k < K; ++k) q[k] = static_cast<uint8_t>(std::nearbyint(std::min(127.f, std::max(-127.f, x[k] * inv))) + 128);
}

// Rows of x (fp32) to u8 with zero point 128; scales[m] = max|x[m]| / 127 (1 for an all-zero row).
void quantize_rows(const float* x, int64_t M, int64_t K, uint8_t* q, float* scales) {
  const int isa = cpu_isa();
  at::parallel_for(0, M, 64, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const float amax = row_amax(x + m * K, K, isa);
      const float scale = amax > 0.f ? amax / 127.f : 1.f;
      quantize(x + m * K, K, 1.f / scale, q + m * K, isa);
      scales[m] = scale;
    }
  });
}

}  // namespace

at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& w_scale,
                       const at::Tensor& w_zero_point, int64_t out_features) {
  TORCH_CHECK(x.dim() == 2, "linear_int8: x must be [M, K]");
  static const auto qlinear =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("onednn::qlinear_pointwise", "")
          .typed<at::Tensor(at::Tensor, double, int64_t, at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>,
                            double, int64_t, std::optional<at::ScalarType>, c10::string_view,
                            c10::List<std::optional<at::Scalar>>, c10::string_view)>();  // by value, as registered
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t M = xf.size(0), K = xf.size(1);
  at::Tensor q = at::empty({M, K}, xf.options().dtype(at::kByte));
  at::Tensor scales = at::empty({M, 1}, xf.options());
  quantize_rows(xf.data_ptr<float>(), M, K, q.data_ptr<uint8_t>(), scales.data_ptr<float>());
  at::Tensor y = qlinear.call(q, 1.0, 128, packed, w_scale, w_zero_point, std::nullopt, 1.0, 0, at::kFloat, "none",
                              c10::List<std::optional<at::Scalar>>(), "");
  y.mul_(scales);
  TORCH_CHECK(y.size(1) == out_features, "linear_int8: the packed weight has ", y.size(1), " outputs, expected ",
              out_features);
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace servelab
