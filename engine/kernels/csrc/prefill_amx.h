// Prefill attention on Intel AMX tiles for the paged op's long query chunks (prefill_amx.cpp).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace servelab {

// The process's tier is amx (cpu_isa.h: AMX-BF16 and AVX512-BF16), and Linux granted it the tile state.
bool amx_available();

// amx_prefill takes these: bf16, head_dim a multiple of 64, on an AMX CPU.
bool amx_prefill_fits(const at::Tensor& q);

// Attention of sequences `seqs` of the paged op's varlen batch (its q, caches, int32 metadata)
// into out's rows; the rest of out is left alone.
void amx_prefill(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const at::Tensor& block_tables, const int32_t* lens, const int32_t* qsl,
                 const std::vector<int64_t>& seqs, double scale, at::Tensor& out);

}  // namespace servelab
