#pragma once

#include <ATen/ATen.h>

namespace servelab {

// x [M, K] (fp32 or bf16) @ W.T for W int8 per channel, prepacked by onednn::qlinear_prepack:
// x quantized per row to int8 here. Returns [M, out_features] in x's dtype.
at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& w_scale,
                       const at::Tensor& w_zero_point, int64_t out_features);

}  // namespace servelab
