// The fused rotary-embedding kernel (nn/fused/fused_rotary_cuda.cu), forward and backward: the
// queries and keys of one attention layer rotated in one launch, in transformers' rotate-half
// layout (apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]). No
// torch header: the kernel's file is compiled by nvcc alone; nn/fused/fused_rotary_ops.h wraps it
// in an autograd function. Every pointer is device memory; every launch goes on CUDA stream
// `stream` (a cudaStream_t) and returns the CUDA error of the launch ("" when none).
#pragma once

#include <cstdint>

#include "nn/fused/fused_kernel.h"

namespace trainer::nn {

// One of the two rotated tensors: `in` [B, T, heads, head_dim] read through the element strides
// of its first three dimensions (its last contiguous: a view of a projection's output reads in
// place), `out` [B, T, heads, head_dim] written contiguous.
struct RotaryTensor {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t heads = 0;
  int64_t stride_b = 0, stride_t = 0, stride_h = 0;
};

// The rotation of q and k (any head counts: grouped-query attention's k has fewer heads). With
// half = head_dim / 2 and, for the token's position p and a pair j < half, c = cos[p, j] and
// s = sin[p, j], both first rounded to `table_dtype` (the dtype the ATen composition multiplies
// by):
//   forward:  out[j] = x[j] c - x[j + half] s,   out[j + half] = x[j + half] c + x[j] s;
//   backward (in: the outputs' gradients g, out: the inputs'), the transposed rotation:
//             out[j] = g[j] c + g[j + half] s,   out[j + half] = g[j + half] c - g[j] s;
// each product rounded to the written dtype before the sum, as ATen's composition and autograd
// round theirs. q and k hold `dtype`; the rotated tensors (forward's out, backward's in) hold
// float32 when table_dtype is float32 (float32 tables times lower-precision q and k promote), else
// `dtype`. Supported table_dtype: float32 or `dtype`.
struct RotaryArgs {
  RotaryTensor q, k;
  const float* cos = nullptr;          // [rows, head_dim / 2]: row p the cosines of p's angles
  const float* sin = nullptr;          // [rows, head_dim / 2]: the sines
  const int64_t* positions = nullptr;  // [B, T] each token's row (< rows); null: start + t
  int64_t start = 0;
  int64_t batch = 0, seq = 0, head_dim = 0;
  FusedDtype dtype = FusedDtype::float32, table_dtype = FusedDtype::float32;
};

const char* launch_rotary_forward(const RotaryArgs& args, void* stream);
const char* launch_rotary_backward(const RotaryArgs& args, void* stream);

}  // namespace trainer::nn
