// A bias-free linear layer whose output rows lie a multiple of 64 elements apart.
//
// A product whose output has an odd number of columns (GPT-2's vocabulary of 50257) has rows that
// start at unaligned addresses, and cuBLAS then takes its slow unaligned kernels for it and for
// both products of its backward, which read the output's gradient: at GPT-2 small's size, about
// 30 ms of a 68 ms step on an H100-class GPU. Writing the output into a buffer whose rows are
// padded (as nanoGPT pads the vocabulary to 50304, but without changing the model) keeps every
// row aligned; the result is a view of the first columns, the padding never read.
#pragma once

#include <torch/types.h>

namespace trainer::nn {

// The name aligned_linear carries for RecordFunction observers, with (x, weight) as inputs.
constexpr const char* kAlignedLinear = "trainer::aligned_linear";

// x [..., C] times weight [V, C] transposed: [..., V], rows `aligned_columns(V)` elements apart
// (a view into a padded buffer when that exceeds V). Under autocast both are cast to its dtype,
// as autocast casts linear's; gradients come back in x's and weight's dtypes.
torch::Tensor aligned_linear(const torch::Tensor& x, const torch::Tensor& weight);

// V rounded up to a multiple of 64.
inline int64_t aligned_columns(int64_t v) {
  return (v + 63) / 64 * 64;
}

}  // namespace trainer::nn
