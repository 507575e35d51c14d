// Each row's next token from a step's logits (token_pick.cpp).
#pragma once

#include <ATen/ATen.h>

namespace servelab {

// Row-wise argmax of logits [B, V] (float32 or bfloat16, contiguous rows) as int64 [B]: the first
// of tied maxima, or the first NaN, exactly as torch.max(dim=-1).indices. isa caps the routines to
// a tier (cpu_isa.h; -1: the process's own).
at::Tensor greedy_pick(const at::Tensor& logits, int64_t isa);

// One draw per row from softmax(logits * inv_temperature) by inverting its CDF at uniforms[b] in
// [0, 1): the first token whose running weight passes u times the row's total. -inf logits are
// never drawn; a row with a NaN answers its first NaN, as greedy_pick does. int64 [B].
// isa: as greedy_pick's.
at::Tensor sample_pick(const at::Tensor& logits, const at::Tensor& inv_temperature, const at::Tensor& uniforms,
                       int64_t isa);

}  // namespace servelab
