// Prefill attention on Intel AMX tiles (bf16 in, fp32 accumulation), for the paged op's long
// query chunks: the path that replaces a gather plus torch's CPU flash attention per sequence.
//
// Two phases, both on torch's threads. First each (sequence, KV head) has its keys and values
// packed from the paged cache (K as rows, V transposed; chunks of 32 keys, zero past the context):
// O(context) work, done once per GQA group. Then a work item is (sequence, query head, 16 query
// rows): for each chunk of 32 keys it sees (causally), two tile products give the scores
// transposed (32 keys x 16 queries), an online softmax in AVX-512 with one query per lane makes
// them bf16 probabilities, and four tile products per 64 dims add V^T P^T into the transposed
// fp32 output, which sits in memory between chunks so the softmax can rescale it.
//
// Every tile is 16 rows of 64 bytes: tmm0/tmm1 scores, then with tmm6/tmm7 the output
// accumulators; tmm4 keys or values (the A operand), tmm5 queries or probabilities (B).

#include "prefill_amx.h"
#include "cpu_isa.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define SERVELAB_AMX 1
#define AMX_FN __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
#endif

namespace servelab {

#ifdef SERVELAB_AMX
namespace {

constexpr int kRows = 16;       // query rows per item (a tile's rows)
constexpr int kChunk = 32;      // keys per chunk (a bf16 tile's row of pairs)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
using bf16 = uint16_t;          // raw bits

struct TileConfig {             // LDTILECFG's 64-byte layout, palette 1
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

AMX_FN inline void configure_tiles() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = kRows;
  }
  // Not _tile_loadconfig: GCC 12 does not see that builtin read the struct, and drops its stores.
  asm volatile("ldtilecfg %0" ::"m"(cfg));
}

AMX_FN inline void release_tiles() { _tile_release(); }

// Where one (sequence, KV head)'s packed keys and values live, in chunks of 32 keys (zero past
// the context): K as plain rows [32 keys][D] (a tile's rows are keys), V transposed [D][32 keys]
// (a tile's rows are dims, its columns pairs of neighbouring keys).
struct Packed {
  const bf16* k;
  const bf16* v;
};

inline int64_t chunk_elems(int64_t D) { return kChunk * D; }  // per chunk, for K and for V alike

void pack(const bf16* cache_k, const bf16* cache_v, const int32_t* table, int64_t ctx, int64_t bs, int64_t kvh_stride,
          int64_t row_stride, int64_t block_stride, int64_t D, bf16* k_out, bf16* v_out) {
  const int64_t nchunks = (ctx + kChunk - 1) / kChunk;
  std::memset(k_out, 0, nchunks * chunk_elems(D) * sizeof(bf16));
  std::memset(v_out, 0, nchunks * chunk_elems(D) * sizeof(bf16));
  for (int64_t t = 0; t < ctx; ++t) {
    const int64_t off = table[t / bs] * block_stride + (t % bs) * row_stride + kvh_stride;
    std::memcpy(k_out + t * D, cache_k + off, D * sizeof(bf16));  // chunk c's rows follow chunk c-1's
    const bf16* vr = cache_v + off;
    bf16* vc = v_out + (t / kChunk) * chunk_elems(D) + t % kChunk;
    for (int64_t d = 0; d < D; ++d) vc[d * kChunk] = vr[d];
  }
}

// 2^x for the softmax, x <= 8 (the lazy rescale's bound): 2^round(x) * 2^r, |r| <= 1/2, by a
// degree-5 polynomial (relative error about 2e-6, far below the bf16 the probabilities become).
AMX_FN inline __m512 exp2_512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.3333558e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.6181291e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5504109e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.24022651f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.69314718f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// The running max moves only when a score passes it by more than this (log2 units): until then
// the probabilities exp2(s - max) may reach 2^8, harmless in fp32 sums and bf16, and the output
// accumulators need no rescaling, so for head_dim 64 they stay in tiles for the whole item.
constexpr float kRescaleAfter = 8.0f;

// One item: rows (<= 16) query rows of one head, at absolute positions pos0 + i, over the packed
// keys [0, ctx). Scores come out transposed (keys x queries), so the softmax runs down columns
// with a query in each lane: no horizontal reduction. The output accumulates transposed, as
// V^T P^T: in tiles tmm0/1/6/7 throughout when kResident (head_dim 64), else in OT between chunks.
template <bool kResident>
AMX_FN void run_rows(const bf16* q, int64_t q_row_stride, int64_t rows, int64_t pos0, int64_t ctx, int64_t D,
                     float scale, Packed kv, bf16* out, int64_t out_row_stride, float* OT, float* ST, uint32_t* PT,
                     uint32_t* QT) {
  // Q^T in pairs: QT[h][r][i] = dims (32h + 2r, 32h + 2r + 1) of query row i.
  const int64_t halves = D / 32;
  std::memset(QT, 0, halves * 16 * kRows * sizeof(uint32_t));
  for (int64_t i = 0; i < rows; ++i) {
    const auto* q32 = reinterpret_cast<const uint32_t*>(q + i * q_row_stride);
    for (int64_t p = 0; p < D / 2; ++p) QT[p * kRows + i] = q32[p];
  }
  const int64_t o_stride = kRows * sizeof(float);
  if constexpr (kResident) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(6);
    _tile_zero(7);
  } else {
    std::memset(OT, 0, D * kRows * sizeof(float));
  }
  __m512 m = _mm512_set1_ps(kNegInf), l = _mm512_setzero_ps();
  const __m512 vscale = _mm512_set1_ps(scale * 1.44269504088896341f);  // scores in log2 units
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  const __m512i pair_up = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                           6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const int64_t nkeys = std::min(ctx, pos0 + rows);  // keys the last real row sees
  const int64_t nchunks = (nkeys + kChunk - 1) / kChunk;
  for (int64_t c = 0; c < nchunks; ++c) {
    const bf16* kc = kv.k + c * chunk_elems(D);
    const bf16* vc = kv.v + c * chunk_elems(D);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t h = 0; h < halves; ++h) {
      _tile_loadd(5, QT + h * 16 * kRows, kRows * sizeof(uint32_t));
      _tile_loadd(4, kc + h * 32, D * sizeof(bf16));
      _tile_dpbf16ps(2, 4, 5);
      _tile_loadd(4, kc + 16 * D + h * 32, D * sizeof(bf16));
      _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(2, ST, kRows * sizeof(float));
    _tile_stored(3, ST + 16 * kRows, kRows * sizeof(float));
    // Key k0 + k is seen by query lanes i with pos0 + i >= k0 + k, if it is inside the context.
    const int64_t k0 = c * kChunk;
    __m512 s[kChunk];
    __mmask16 seen[kChunk];
    __m512 mx = neg_inf;
    for (int k = 0; k < kChunk; ++k) {
      const int64_t first = k0 + k - pos0;  // the first lane that sees it
      seen[k] = (k0 + k >= ctx || first >= 16) ? 0 : first <= 0 ? 0xFFFF : static_cast<__mmask16>(0xFFFF << first);
      s[k] = _mm512_mask_mul_ps(neg_inf, seen[k], _mm512_loadu_ps(ST + k * kRows), vscale);
      mx = _mm512_max_ps(mx, s[k]);
    }
    // Every row sees key 0 (chunk 0), so after chunk 0 the max is finite in every lane.
    const __mmask16 moved = _mm512_cmp_ps_mask(mx, _mm512_add_ps(m, _mm512_set1_ps(kRescaleAfter)), _CMP_GT_OQ);
    if (moved) {
      const __m512 m_new = _mm512_mask_max_ps(m, moved, m, mx);
      if (c > 0) {  // chunk 0 has nothing accumulated yet
        const __m512 alpha = exp2_512(_mm512_sub_ps(m, m_new));
        l = _mm512_mul_ps(l, alpha);
        if constexpr (kResident) {
          _tile_stored(0, OT, o_stride);
          _tile_stored(1, OT + 16 * kRows, o_stride);
          _tile_stored(6, OT + 32 * kRows, o_stride);
          _tile_stored(7, OT + 48 * kRows, o_stride);
        }
        for (int64_t d = 0; d < D; ++d)
          _mm512_storeu_ps(OT + d * kRows, _mm512_mul_ps(_mm512_loadu_ps(OT + d * kRows), alpha));
        if constexpr (kResident) {
          _tile_loadd(0, OT, o_stride);
          _tile_loadd(1, OT + 16 * kRows, o_stride);
          _tile_loadd(6, OT + 32 * kRows, o_stride);
          _tile_loadd(7, OT + 48 * kRows, o_stride);
        }
      }
      m = m_new;
    }
    __m512 sum = _mm512_setzero_ps();
    for (int k = 0; k < kChunk; k += 2) {
      const __m512 p0 = _mm512_maskz_mov_ps(seen[k], exp2_512(_mm512_sub_ps(s[k], m)));
      const __m512 p1 = _mm512_maskz_mov_ps(seen[k + 1], exp2_512(_mm512_sub_ps(s[k + 1], m)));
      sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
      // Row k/2 of P^T in pairs: lane i holds (p0[i], p1[i]) as two bf16.
      _mm512_storeu_si512(PT + (k / 2) * kRows, _mm512_permutexvar_epi16(pair_up, (__m512i)_mm512_cvtne2ps_pbh(p1, p0)));
    }
    l = _mm512_add_ps(l, sum);
    _tile_loadd(5, PT, kRows * sizeof(uint32_t));
    if constexpr (kResident) {
      _tile_loadd(4, vc, kChunk * sizeof(bf16));
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(4, vc + 16 * kChunk, kChunk * sizeof(bf16));
      _tile_dpbf16ps(1, 4, 5);
      _tile_loadd(4, vc + 32 * kChunk, kChunk * sizeof(bf16));
      _tile_dpbf16ps(6, 4, 5);
      _tile_loadd(4, vc + 48 * kChunk, kChunk * sizeof(bf16));
      _tile_dpbf16ps(7, 4, 5);
    } else {
      for (int64_t g = 0; g < D / 16; g += 4) {  // four 16-dim groups of V^T P^T per pass
        float* o = OT + g * 16 * kRows;
        _tile_loadd(0, o, o_stride);
        _tile_loadd(1, o + 16 * kRows, o_stride);
        _tile_loadd(6, o + 32 * kRows, o_stride);
        _tile_loadd(7, o + 48 * kRows, o_stride);
        _tile_loadd(4, vc + (g + 0) * 16 * kChunk, kChunk * sizeof(bf16));
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(4, vc + (g + 1) * 16 * kChunk, kChunk * sizeof(bf16));
        _tile_dpbf16ps(1, 4, 5);
        _tile_loadd(4, vc + (g + 2) * 16 * kChunk, kChunk * sizeof(bf16));
        _tile_dpbf16ps(6, 4, 5);
        _tile_loadd(4, vc + (g + 3) * 16 * kChunk, kChunk * sizeof(bf16));
        _tile_dpbf16ps(7, 4, 5);
        _tile_stored(0, o, o_stride);
        _tile_stored(1, o + 16 * kRows, o_stride);
        _tile_stored(6, o + 32 * kRows, o_stride);
        _tile_stored(7, o + 48 * kRows, o_stride);
      }
    }
  }
  if constexpr (kResident) {
    _tile_stored(0, OT, o_stride);
    _tile_stored(1, OT + 16 * kRows, o_stride);
    _tile_stored(6, OT + 32 * kRows, o_stride);
    _tile_stored(7, OT + 48 * kRows, o_stride);
  }
  const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.f), l);
  for (int64_t d = 0; d < D; ++d) _mm512_storeu_ps(OT + d * kRows, _mm512_mul_ps(_mm512_loadu_ps(OT + d * kRows), inv));
  const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(kRows));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t d = 0; d < D; d += 32) {
      const __m512 a = _mm512_i32gather_ps(column, OT + d * kRows + i, 4);
      const __m512 b = _mm512_i32gather_ps(column, OT + (d + 16) * kRows + i, 4);
      _mm512_storeu_si512(out + i * out_row_stride + d, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
  }
}

template <typename Fn>
void for_each_dynamic(int64_t n, const Fn& fn) {
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), n), 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  });
}

struct Item {
  int64_t seq, head, row0;
};

}  // namespace

bool amx_available() {
  if (cpu_isa() < kAmx) return false;  // the tier has AMX-BF16 and AVX512-BF16 (cpu_isa.h)
  // Linux hands out the tile state only on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
  static const bool granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
}

bool amx_prefill_fits(const at::Tensor& q) {
  return q.scalar_type() == at::kBFloat16 && q.size(2) % 64 == 0 && amx_available();
}

void amx_prefill(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const at::Tensor& block_tables, const int32_t* lens, const int32_t* qsl,
                 const std::vector<int64_t>& seqs, double scale, at::Tensor& out) {
  TORCH_CHECK(amx_prefill_fits(q), "amx_prefill: bf16, head_dim a multiple of 64, and an AMX CPU");
  TORCH_CHECK(k_cache.strides() == v_cache.strides(), "amx_prefill: k_cache and v_cache strides differ");
  const int64_t H = q.size(1), D = q.size(2), kvh = k_cache.size(2), bs = k_cache.size(1), G = H / kvh;
  const int64_t max_blocks = block_tables.size(1);
  // Phase 1: pack every (sequence, KV head)'s keys and values.
  std::vector<int64_t> offset(seqs.size() + 1, 0);
  for (size_t s = 0; s < seqs.size(); ++s)
    offset[s + 1] = offset[s] + (lens[seqs[s]] + kChunk - 1) / kChunk * chunk_elems(D) * kvh;
  at::Tensor packed = at::empty({2, offset.back()}, q.options());
  auto* pk = reinterpret_cast<bf16*>(packed[0].data_ptr());
  auto* pv = reinterpret_cast<bf16*>(packed[1].data_ptr());
  const auto* ck = reinterpret_cast<const bf16*>(k_cache.data_ptr());
  const auto* cv = reinterpret_cast<const bf16*>(v_cache.data_ptr());
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  auto per_head = [&](size_t s) { return (lens[seqs[s]] + kChunk - 1) / kChunk * chunk_elems(D); };
  for_each_dynamic(static_cast<int64_t>(seqs.size()) * kvh, [&](int64_t i) {
    const size_t s = i / kvh;
    const int64_t h = i % kvh, seq = seqs[s];
    const int64_t at = offset[s] + h * per_head(s);
    pack(ck, cv, tables + seq * max_blocks, lens[seq], bs, h * k_cache.stride(2), k_cache.stride(1),
         k_cache.stride(0), D, pk + at, pv + at);
  });
  // Phase 2: (sequence, query head, 16 rows) items, the ones with the most keys first.
  std::vector<Item> items;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t qlen = qsl[seqs[s] + 1] - qsl[seqs[s]];
    for (int64_t r = 0; r < qlen; r += kRows)
      for (int64_t h = 0; h < H; ++h) items.push_back({static_cast<int64_t>(s), h, r});
  }
  std::stable_sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
    const int64_t ka = lens[seqs[a.seq]] - (qsl[seqs[a.seq] + 1] - qsl[seqs[a.seq]]) + a.row0;
    const int64_t kb = lens[seqs[b.seq]] - (qsl[seqs[b.seq] + 1] - qsl[seqs[b.seq]]) + b.row0;
    return ka > kb;
  });
  const auto* qd = reinterpret_cast<const bf16*>(q.data_ptr());
  auto* od = reinterpret_cast<bf16*>(out.data_ptr());
  const int64_t threads = at::get_num_threads();
  std::vector<std::vector<char>> scratch(threads);
  const size_t scratch_bytes = (D * kRows + kChunk * kRows) * sizeof(float) +
                               (kChunk / 2 * kRows + D / 2 * kRows) * sizeof(uint32_t) + 64;
  for_each_dynamic(static_cast<int64_t>(items.size()), [&](int64_t n) {
    std::vector<char>& buf = scratch[at::get_thread_num()];
    if (buf.empty()) buf.resize(scratch_bytes);
    char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t{63});
    float* OT = reinterpret_cast<float*>(base);
    float* ST = OT + D * kRows;
    uint32_t* PT = reinterpret_cast<uint32_t*>(ST + kChunk * kRows);
    uint32_t* QT = PT + kChunk / 2 * kRows;
    const Item& it = items[n];
    const int64_t seq = seqs[it.seq], qlen = qsl[seq + 1] - qsl[seq], ctx = lens[seq];
    const int64_t rows = std::min<int64_t>(kRows, qlen - it.row0);
    const int64_t kv_head = it.head / G;
    const int64_t at = offset[it.seq] + kv_head * per_head(it.seq);
    const int64_t t0 = qsl[seq] + it.row0;
    configure_tiles();
    (D == 64 ? run_rows<true> : run_rows<false>)(qd + t0 * q.stride(0) + it.head * q.stride(1), q.stride(0), rows, ctx - qlen + it.row0, ctx, D,
             static_cast<float>(scale), Packed{pk + at, pv + at}, od + t0 * out.stride(0) + it.head * out.stride(1),
             out.stride(0), OT, ST, PT, QT);
    release_tiles();
  });
}

#else  // no AMX on this architecture: the caller takes its other path

bool amx_available() { return false; }
bool amx_prefill_fits(const at::Tensor&) { return false; }
void amx_prefill(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const int32_t*,
                 const int32_t*, const std::vector<int64_t>&, double, at::Tensor&) {
  TORCH_CHECK(false, "amx_prefill: not an x86-64 Linux build");
}

#endif

}  // namespace servelab
