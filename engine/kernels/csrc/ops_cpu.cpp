// The ops' entry points and registration (torch.ops.servelab.*): the varlen attention op, which
// sends each sequence's chunk to its path (the loops of paged_attention_cpu.cpp for decodes and
// short chunks; AMX tiles, prefill_amx.cpp, or torch's SDPA for long ones), the cache write, and
// oneDNN's prepacked linears (fp32/bf16, and int8: linear_int8.cpp) as ops of this library.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cpu_isa.h"
#include "linear_int8.h"
#include "paged_attention_loops.h"
#include "prefill_amx.h"
#include "token_pick.h"

namespace {

constexpr int64_t kSplitTokens = 256;  // a decode split covers at least this many keys

// A long prefill chunk: torch's CPU flash attention (oneDNN/AMX-backed where the CPU has it) beats
// any loop here at O(n^2) work, so the op gathers the sequence's blocks (O(n)) and hands it over.
void prefill_with_sdpa(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& table, int64_t ctx, int64_t q0, int64_t qlen, double scale, at::Tensor& out) {
  const int64_t bs = k_cache.size(1), kvh = k_cache.size(2), D = k_cache.size(3);
  const int64_t nblk = (ctx + bs - 1) / bs;
  const at::Tensor ids = table.narrow(0, 0, nblk).to(at::kLong);
  auto gather = [&](const at::Tensor& cache) {  // -> [1, KVH, ctx, D]
    return cache.index_select(0, ids).reshape({nblk * bs, kvh, D}).narrow(0, 0, ctx).permute({1, 0, 2}).unsqueeze(0);
  };
  const at::Tensor qs = q.narrow(0, q0, qlen).permute({1, 0, 2}).unsqueeze(0);
  std::optional<at::Tensor> mask;
  if (ctx != qlen) {  // a cached prefix: query i (at position ctx - qlen + i) sees keys <= its position
    const at::Tensor pos = at::arange(ctx, q.options().dtype(at::kLong));
    mask = pos.unsqueeze(0) <= pos.narrow(0, ctx - qlen, qlen).unsqueeze(1);
  }
  const at::Tensor o = at::scaled_dot_product_attention(qs, gather(k_cache), gather(v_cache), mask, 0.0,
                                                        /*is_causal=*/ctx == qlen, scale, /*enable_gqa=*/true);
  out.narrow(0, q0, qlen).copy_(o[0].permute({1, 0, 2}));
}

void check_inputs(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& qsl) {
  TORCH_CHECK(q.device().is_cpu(), "paged_attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.dim() == 4, "q [T, H, D], caches [NB, bs, KVH, D]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "k_cache and v_cache differ in shape");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "q and the caches must share a dtype");
  TORCH_CHECK(q.size(2) == k_cache.size(3), "head_dim of q and the cache differ");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(q.stride(2) == 1 && k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "head_dim must be contiguous");
  for (const at::Tensor* t : {&block_tables, &seq_lens, &qsl})
    TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous(), "metadata must be contiguous int32");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == seq_lens.size(0), "block_tables [B, max_blocks]");
  TORCH_CHECK(qsl.numel() == seq_lens.numel() + 1, "query_start_loc has B + 1 entries");
}

// Writes into out ([T, H, D], poisoned by the tests, so every element must be written). isa caps
// the routines to a tier (cpu_isa.h; -1: the process's own), AMX tiles included.
void paged_attention_out(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                         const at::Tensor& block_tables, const at::Tensor& seq_lens,
                         const at::Tensor& query_start_loc, double scale, int64_t split_tokens, int64_t isa,
                         int64_t sdpa_from, bool amx) {
  check_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc);
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type() && out.stride(2) == 1,
              "out must be like q");
  if (split_tokens <= 0) split_tokens = kSplitTokens;
  const int tier = servelab::isa_cap(isa);
  const int32_t* qsl = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  std::vector<bool> done(seq_lens.size(0), false);
  std::vector<int64_t> long_chunks;  // sequences whose chunk goes to a GEMM path: AMX tiles, else SDPA
  for (int64_t s = 0; s < seq_lens.size(0) && sdpa_from > 0; ++s) {
    if (qsl[s + 1] - qsl[s] < sdpa_from) continue;
    long_chunks.push_back(s);
    done[s] = true;
  }
  if (amx && tier >= servelab::kAmx && !long_chunks.empty() && servelab::amx_prefill_fits(q)) {
    servelab::amx_prefill(q, k_cache, v_cache, block_tables, lens, qsl, long_chunks, scale, out);
  } else {
    for (const int64_t s : long_chunks)
      prefill_with_sdpa(q, k_cache, v_cache, block_tables[s], lens[s], qsl[s], qsl[s + 1] - qsl[s], scale, out);
  }
  servelab::attention_loops(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, split_tokens, tier,
                            done, out);
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& seq_lens,
                           const at::Tensor& query_start_loc, double scale, int64_t split_tokens, int64_t isa,
                           int64_t sdpa_from, bool amx) {
  at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
  paged_attention_out(out, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, split_tokens, isa,
                      sdpa_from, amx);
  return out;
}

// Writes each token's K/V ([T, KVH, D]) into slot slot_mapping[t] (block * block_size + row); -1 skips.
void store_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slot_mapping) {
  TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes(), "k, v [T, KVH, D]");
  TORCH_CHECK(k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == v_cache.scalar_type(),
              "new K/V and the cache must share a dtype");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1 && k_cache.stride(3) == 1 && v_cache.stride(3) == 1,
              "head_dim must be contiguous");
  TORCH_CHECK(k.size(1) == k_cache.size(2) && k.size(2) == k_cache.size(3), "K/V and cache shapes differ");
  const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t T = k.size(0), kvh = k.size(1), D = k.size(2), bs = k_cache.size(1);
  const int64_t nslots = k_cache.size(0) * bs;
  const int64_t bytes = D * k.element_size();
  auto* kd = static_cast<char*>(k_cache.data_ptr());
  auto* vd = static_cast<char*>(v_cache.data_ptr());
  const auto* ks = static_cast<const char*>(k.data_ptr());
  const auto* vs = static_cast<const char*>(v.data_ptr());
  const int64_t es = k.element_size();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = slot[t];
    if (s < 0) continue;
    TORCH_CHECK(s < nslots, "slot ", s, " is outside the cache");
    const int64_t blk = s / bs, row = s % bs;
    for (int64_t h = 0; h < kvh; ++h) {
      std::memcpy(kd + (blk * k_cache.stride(0) + row * k_cache.stride(1) + h * k_cache.stride(2)) * es,
                  ks + (t * k.stride(0) + h * k.stride(1)) * es, bytes);
      std::memcpy(vd + (blk * v_cache.stride(0) + row * v_cache.stride(1) + h * v_cache.stride(2)) * es,
                  vs + (t * v.stride(0) + h * v.stride(1)) * es, bytes);
    }
  }
}

std::string cpu_isa() { return servelab::isa_name(servelab::cpu_isa()); }

// oneDNN's prepacked linear (mkldnn::_linear_pointwise) as an op of this library, so that the
// compiled forward reaches it through the dispatcher alone: the Python custom op that wrapped it
// cost about 10 us a call, 120 calls a step.
at::Tensor linear_prepacked(const at::Tensor& x, const at::Tensor& packed, int64_t /*out_features*/) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                            c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>)>();
  return op.call(x, packed, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), c10::string_view(""));
}

}  // namespace

TORCH_LIBRARY(servelab, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
      "Tensor query_start_loc, float scale, int split_tokens=0, int isa=-1, int sdpa_from=64, bool amx=True) -> Tensor");
  m.def(
      "paged_attention_out(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor seq_lens, Tensor query_start_loc, float scale, int split_tokens=0, int isa=-1, int sdpa_from=64, "
      "bool amx=True) -> ()");
  m.def("store_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
  m.def("cpu_isa", &cpu_isa);  // the tier's name, as engine.platform.machine.cpu().tier
  m.def("has_amx", &servelab::amx_available);
  m.def("linear_prepacked(Tensor x, Tensor packed, int out_features) -> Tensor");
  m.def("linear_int8(Tensor x, Tensor packed, Tensor w_scale, Tensor w_zero_point, int out_features) -> Tensor");
  m.def("greedy_pick(Tensor logits, int isa=-1) -> Tensor");
  m.def("sample_pick(Tensor logits, Tensor inv_temperature, Tensor uniforms, int isa=-1) -> Tensor");
}

TORCH_LIBRARY_IMPL(servelab, CPU, m) {
  m.impl("paged_attention", paged_attention);
  m.impl("paged_attention_out", paged_attention_out);
  m.impl("store_kv", store_kv);
  m.impl("linear_prepacked", linear_prepacked);
  m.impl("linear_int8", servelab::linear_int8);
  m.impl("greedy_pick", servelab::greedy_pick);
  m.impl("sample_pick", servelab::sample_pick);
}

// The prepacked weight is an opaque oneDNN tensor, whose dispatch key (MkldnnCPU) picks the kernel.
TORCH_LIBRARY_IMPL(servelab, MkldnnCPU, m) {
  m.impl("linear_prepacked", linear_prepacked);
  m.impl("linear_int8", servelab::linear_int8);
}
