// The paged attention op's own loops (paged_attention_cpu.cpp): decodes and short prefill chunks.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace servelab {

// Attention for every sequence of the varlen batch not marked done, into out's rows (fp32
// accumulation; split_tokens: the fewest keys per split-KV part; isa: the tier whose routines
// may run (cpu_isa.h), already capped to the process's: scalar, AVX2 or AVX-512).
void attention_loops(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                     double scale, int64_t split_tokens, int isa, const std::vector<bool>& done, at::Tensor& out);

}  // namespace servelab
