// Paged attention on CPU, the op's own loops (its entry point is ops_cpu.cpp): decodes and short
// prefill chunks, walking the block table and reading K/V blocks in place (no gather).
//
// The batch is varlen: sequence b has query tokens [query_start_loc[b], query_start_loc[b+1]) of q,
// which are its last tokens, so its i-th query token sits at position seq_lens[b] - q_len + i and
// sees keys 0..position (decode is q_len = 1). A work item is (sequence, KV head, a tile of query
// tokens, a range of key blocks): its rows are every (token, query head of that KV head's GQA
// group) pair, so each K/V block is read once per group. Scores, softmax and the weighted sum are
// fp32 with an online softmax. Long decodes with few work items are split over key ranges and
// merged (split-KV). Items are pulled from an atomic counter by torch's own threads, largest first.
//
// The AVX-512 routines (attention_avx512.cpp) and the AVX2 ones (attention_avx2.cpp) are compiled
// for their target only (a function attribute) and chosen at run time from the process's tier
// (cpu_isa.h, pick_kernels below); the scalar ones here are the fallback on any other CPU.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include "attention_kernels.h"
#include "cpu_isa.h"
#include "paged_attention_loops.h"
#include "simd_exp.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define SERVELAB_X86 1
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

namespace {

using servelab::attn::DecodeFn;
using servelab::attn::FoldFn;
using servelab::attn::Kernels;
using servelab::attn::LoadFn;
using servelab::attn::Rows;

constexpr int64_t kTileTokens = 16;   // prefill query tokens per work item
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }

// ---- scalar fallback -------------------------------------------------------------------------

template <typename T>
void load_block_scalar(const T* src, int64_t row_stride, int64_t n, int64_t D, float* dst) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < D; ++d) dst[j * D + d] = to_float(src[j * row_stride + d]);
}

void fold_scalar(const float* q, int64_t R, int64_t D, const float* k, const float* v, const int64_t* visible,
                 float* s, Rows rows) {
  for (int64_t r = 0; r < R; ++r) {
    const int64_t nv = visible[r];
    if (nv <= 0) continue;
    const float* qr = q + r * D;
    float mx = kNegInf;
    for (int64_t j = 0; j < nv; ++j) {
      float dot = 0.f;
      for (int64_t d = 0; d < D; ++d) dot += qr[d] * k[j * D + d];
      s[j] = dot;
      mx = std::max(mx, dot);
    }
    const float m_new = std::max(rows.m[r], mx);
    const float alpha = std::exp(rows.m[r] - m_new);  // 0 on the first block (m = -inf)
    float* acc = rows.acc + r * D;
    for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
    float sum = 0.f;
    for (int64_t j = 0; j < nv; ++j) {
      const float p = std::exp(s[j] - m_new);
      sum += p;
      for (int64_t d = 0; d < D; ++d) acc[d] += p * v[j * D + d];
    }
    rows.l[r] = rows.l[r] * alpha + sum;
    rows.m[r] = m_new;
  }
}

// isa: the tier whose routines may run (cpu_isa.h), already capped.
template <typename T>
Kernels<T> pick_kernels(int64_t D, int64_t G, int isa) {
#ifdef SERVELAB_X86
  if (isa >= servelab::kAvx512 && D % 16 == 0 && D <= 256) return servelab::attn::avx512_kernels<T>(D, G, isa);
  if (isa >= servelab::kAvx2 && D % 8 == 0) return servelab::attn::avx2_kernels<T>(D, G);
#endif
  return {load_block_scalar<T>, fold_scalar, nullptr};
}

// ---- work items ------------------------------------------------------------------------------

struct Item {
  int64_t seq, head;
  int64_t q0, nq;      // query tokens [q0, q0 + nq) of q
  int64_t kb0, kb1;    // key blocks [kb0, kb1) of the sequence
  int64_t part;        // -1: write the output; else the slot of this split's partial result
  int64_t cost;
};

struct SplitGroup {  // one decode (query token q0, KV head) cut into parts [first_part, first_part + count)
  int64_t q0, head, first_part, count;
};

struct Batch {
  std::vector<Item> items;
  std::vector<SplitGroup> split_groups;
  int64_t num_parts = 0;
};

Batch plan(const int32_t* seq_lens, const int32_t* qsl, int64_t num_seqs, int64_t kvh, int64_t block_size,
           int64_t num_threads, int64_t split_tokens, const std::vector<bool>& done) {
  Batch b;
  int64_t unsplit = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    if (done[s]) continue;
    const int64_t qlen = qsl[s + 1] - qsl[s];
    unsplit += kvh * ((qlen + kTileTokens - 1) / kTileTokens);
  }
  // Few items (a small batch): cut long decodes into key ranges so that every thread has work.
  const int64_t want = 4 * num_threads;
  const int64_t max_splits = unsplit >= want ? 1 : (want + unsplit - 1) / std::max<int64_t>(unsplit, 1);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t qlen = qsl[s + 1] - qsl[s];
    const int64_t ctx = seq_lens[s];
    if (qlen <= 0 || done[s]) continue;
    const int64_t first_pos = ctx - qlen;
    const int64_t nblocks = (ctx + block_size - 1) / block_size;
    if (qlen == 1) {
      const int64_t splits = std::max<int64_t>(1, std::min(max_splits, ctx / std::max<int64_t>(split_tokens, 1)));
      for (int64_t h = 0; h < kvh; ++h) {
        if (splits > 1) b.split_groups.push_back({qsl[s], h, b.num_parts, splits});
        for (int64_t p = 0; p < splits; ++p) {
          const int64_t kb0 = nblocks * p / splits, kb1 = nblocks * (p + 1) / splits;
          b.items.push_back({s, h, qsl[s], 1, kb0, kb1, splits > 1 ? b.num_parts++ : -1, kb1 - kb0});
        }
      }
      continue;
    }
    for (int64_t t0 = 0; t0 < qlen; t0 += kTileTokens) {
      const int64_t nq = std::min(kTileTokens, qlen - t0);
      const int64_t kb1 = (first_pos + t0 + nq - 1) / block_size + 1;  // the tile's last query sees up to here
      for (int64_t h = 0; h < kvh; ++h) b.items.push_back({s, h, qsl[s] + t0, nq, 0, kb1, -1, kb1 * nq});
    }
  }
  return b;
}

template <typename T>
struct Args {
  const T* q;
  int64_t q_tok, q_head;
  const T* k;
  const T* v;
  int64_t k_block, k_row, k_head, v_block, v_row, v_head;
  const int32_t* tables;
  int64_t table_stride;
  const int32_t* seq_lens;
  const int32_t* qsl;
  T* out;
  int64_t out_tok, out_head;
  float* part_acc;  // [num_parts * G, D]
  float* part_m;    // [num_parts * G]
  float* part_l;
  int64_t D, G, block_size;
  float scale;
};

template <typename T>
struct Scratch {
  std::vector<float> q, m, l, acc, k, v, s;
  std::vector<T> q_raw;  // a decode's G query rows as stored
  std::vector<int64_t> visible;
  Scratch(int64_t rows, int64_t D, int64_t bs)
      : q(rows * D), m(rows), l(rows), acc(rows * D), k(bs * D), v(bs * D), s(rows * (bs + 16)), q_raw(rows * D),
        visible(rows) {}
};

template <typename T>
void run_item(const Args<T>& a, const Kernels<T>& kern, const Item& it, Scratch<T>& sc) {
  const int64_t D = a.D, G = a.G, bs = a.block_size;
  const int64_t R = it.nq * G;
  for (int64_t t = 0; t < it.nq; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const T* src = a.q + (it.q0 + t) * a.q_tok + (it.head * G + g) * a.q_head;
      float* dst = sc.q.data() + (t * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = to_float(src[d]) * a.scale;
      if (it.nq == 1) std::copy_n(src, D, sc.q_raw.data() + g * D);
    }
  std::fill_n(sc.m.data(), R, kNegInf);
  std::fill_n(sc.l.data(), R, 0.f);
  std::fill_n(sc.acc.data(), R * D, 0.f);
  const int64_t ctx = a.seq_lens[it.seq];
  const int64_t first_pos = ctx - (a.qsl[it.seq + 1] - a.qsl[it.seq]);  // position of the sequence's first query
  const int64_t tile_pos = first_pos + (it.q0 - a.qsl[it.seq]);
  const Rows rows{sc.m.data(), sc.l.data(), sc.acc.data()};
  for (int64_t blk = it.kb0; blk < it.kb1; ++blk) {
    const int64_t start = blk * bs;
    const int64_t n = std::min(bs, ctx - start);
    const int64_t phys = a.tables[it.seq * a.table_stride + blk];
    const T* kb = a.k + phys * a.k_block + it.head * a.k_head;
    const T* vb = a.v + phys * a.v_block + it.head * a.v_head;
    if (blk + 1 < it.kb1) {
      // Ask for the next block's K and V of this head while this one is folded: a sequence's
      // blocks lie anywhere in the cache, and each began with a stall on memory
      // (bench/attention_op_bench.py --shuffled: 49 -> 40 ms on huge pages, 57 -> 42 on 4 KiB).
      const int64_t next = a.tables[it.seq * a.table_stride + blk + 1];
      const char* nk = reinterpret_cast<const char*>(a.k + next * a.k_block + it.head * a.k_head);
      const char* nv = reinterpret_cast<const char*>(a.v + next * a.v_block + it.head * a.v_head);
      const int64_t span = ((bs - 1) * a.k_row + D) * static_cast<int64_t>(sizeof(T));  // this head's rows
      for (int64_t off = 0; off < span; off += 64) {
        __builtin_prefetch(nk + off, 0, 3);
        __builtin_prefetch(nv + off, 0, 3);
      }
    }
    if (it.nq == 1 && kern.decode != nullptr) {  // a decode sees every key of its blocks
      kern.decode(sc.q.data(), sc.q_raw.data(), a.scale, kb, a.k_row, vb, a.v_row, n, sc.s.data(), rows);
      continue;
    }
    kern.load(kb, a.k_row, n, D, sc.k.data());
    kern.load(vb, a.v_row, n, D, sc.v.data());
    for (int64_t t = 0; t < it.nq; ++t) {
      const int64_t seen = std::clamp<int64_t>(tile_pos + t - start + 1, 0, n);  // causal: keys <= position
      for (int64_t g = 0; g < G; ++g) sc.visible[t * G + g] = seen;
    }
    kern.fold(sc.q.data(), R, D, sc.k.data(), sc.v.data(), sc.visible.data(), sc.s.data(), rows);
  }
  if (it.part >= 0) {  // one split of a decode: keep the unnormalised partial for the merge
    std::memcpy(a.part_acc + it.part * G * D, sc.acc.data(), sizeof(float) * G * D);
    std::memcpy(a.part_m + it.part * G, sc.m.data(), sizeof(float) * G);
    std::memcpy(a.part_l + it.part * G, sc.l.data(), sizeof(float) * G);
    return;
  }
  for (int64_t t = 0; t < it.nq; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r = t * G + g;
      const float inv = 1.f / sc.l[r];
      T* dst = a.out + (it.q0 + t) * a.out_tok + (it.head * G + g) * a.out_head;
      for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(sc.acc[r * D + d] * inv);
    }
}

template <typename T>
void merge_splits(const Args<T>& a, const SplitGroup& sg) {
  const int64_t D = a.D, G = a.G;
  std::vector<float> acc(D);
  for (int64_t g = 0; g < G; ++g) {
    float mx = kNegInf;
    for (int64_t p = 0; p < sg.count; ++p) mx = std::max(mx, a.part_m[(sg.first_part + p) * G + g]);
    std::fill(acc.begin(), acc.end(), 0.f);
    float sum = 0.f;
    for (int64_t p = 0; p < sg.count; ++p) {
      const int64_t slot = (sg.first_part + p) * G + g;
      if (a.part_m[slot] == kNegInf) continue;  // an empty split
      const float w = std::exp(a.part_m[slot] - mx);
      sum += w * a.part_l[slot];
      for (int64_t d = 0; d < D; ++d) acc[d] += w * a.part_acc[slot * D + d];
    }
    T* dst = a.out + sg.q0 * a.out_tok + (sg.head * G + g) * a.out_head;
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(acc[d] / sum);
  }
}

// Runs fn(i) for i in [0, n) on torch's threads, each pulling the next index from a shared counter.
template <typename Fn>
void for_each_dynamic(int64_t n, int64_t num_threads, const Fn& fn) {
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(num_threads, n), 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  });
}

template <typename T>
void attention_typed(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& qsl, double scale,
                     int64_t split_tokens, int isa, const std::vector<bool>& done, at::Tensor& out) {
  const int64_t H = q.size(1), D = q.size(2), kvh = k_cache.size(2), bs = k_cache.size(1);
  const int64_t num_threads = at::get_num_threads();
  Batch b = plan(seq_lens.data_ptr<int32_t>(), qsl.data_ptr<int32_t>(), seq_lens.size(0), kvh, bs, num_threads,
                 split_tokens, done);
  std::stable_sort(b.items.begin(), b.items.end(), [](const Item& x, const Item& y) { return x.cost > y.cost; });
  const int64_t G = H / kvh;
  at::Tensor part_acc = at::empty({b.num_parts * G, D}, q.options().dtype(at::kFloat));
  at::Tensor part_ml = at::empty({2, b.num_parts * G}, q.options().dtype(at::kFloat));
  Args<T> a{q.data_ptr<T>(),
            q.stride(0),
            q.stride(1),
            k_cache.data_ptr<T>(),
            v_cache.data_ptr<T>(),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            v_cache.stride(0),
            v_cache.stride(1),
            v_cache.stride(2),
            block_tables.data_ptr<int32_t>(),
            block_tables.stride(0),
            seq_lens.data_ptr<int32_t>(),
            qsl.data_ptr<int32_t>(),
            out.data_ptr<T>(),
            out.stride(0),
            out.stride(1),
            part_acc.data_ptr<float>(),
            part_ml.data_ptr<float>(),
            part_ml.data_ptr<float>() + b.num_parts * G,
            D,
            G,
            bs,
            static_cast<float>(scale)};
  const Kernels<T> kern = pick_kernels<T>(D, G, isa);
  const std::vector<Item>& items = b.items;
  // One scratch per thread, made on first use by that thread.
  std::vector<std::unique_ptr<Scratch<T>>> scratch(num_threads);
  for_each_dynamic(static_cast<int64_t>(items.size()), num_threads, [&](int64_t i) {
    auto& sc = scratch[at::get_thread_num()];
    if (!sc) sc = std::make_unique<Scratch<T>>(kTileTokens * G, D, bs);
    run_item(a, kern, items[i], *sc);
  });
  for_each_dynamic(static_cast<int64_t>(b.split_groups.size()), num_threads,
                   [&](int64_t g) { merge_splits(a, b.split_groups[g]); });
}

}  // namespace

namespace servelab {

void attention_loops(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                     double scale, int64_t split_tokens, int isa, const std::vector<bool>& done, at::Tensor& out) {
  switch (q.scalar_type()) {  // fp32 accumulation for every input dtype (so no double)
    case at::kFloat:
      attention_typed<float>(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, split_tokens, isa, done, out);
      break;
    case at::kBFloat16:
      attention_typed<c10::BFloat16>(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, split_tokens,
                                     isa, done, out);
      break;
    case at::kHalf:
      attention_typed<c10::Half>(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, split_tokens,
                                 isa, done, out);
      break;
    default:
      TORCH_CHECK(false, "paged_attention: float32, bfloat16 or float16, got ", q.scalar_type());
  }
}

}  // namespace servelab
