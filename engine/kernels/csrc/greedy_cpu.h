// The greedy pick over a step's logits (greedy_cpu.cpp).
#pragma once

#include <ATen/ATen.h>

namespace servelab {

// Row-wise argmax of logits [B, V] (float32 or bfloat16, contiguous rows) as int64 [B]: the first
// of tied maxima, or the first NaN, exactly as torch.max(dim=-1).indices.
at::Tensor greedy_pick(const at::Tensor& logits);

}  // namespace servelab
