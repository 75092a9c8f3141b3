// The fused rotary-embedding kernel (nn/fused/fused_rotary_kernel.h) as one autograd function over
// a layer's queries and keys: both rotated in one kernel forward and one backward, the cos and sin
// of every position read from tables computed once. fused_rotary_supports says whether it takes
// these tensors (on a CUDA device, of a dtype the kernel has, in a build with it); the callers
// keep their ATen composition otherwise (always on the CPU).
#pragma once

#include <torch/torch.h>

#include <utility>

namespace trainer::nn {

// The rotation of a batch's tokens: the tables of every position's cos and sin, and the row each
// token reads.
struct RotaryTables {
  torch::Tensor cos, sin;   // [rows, hd / 2] float32, contiguous: row p the cos / sin of p's angles
  torch::Tensor positions;  // [B, T] int64, each token's position (< rows); undefined: start + t
  int64_t start = 0;        // without positions, the first token's position
  // The dtype the tables' values are rounded to before they multiply, as the ATen composition
  // casts its cos and sin (the hidden states' dtype).
  torch::ScalarType dtype = torch::kFloat;
};

// q [B, T, Hq, hd] and k [B, T, Hk, hd] of one dtype (float32/bfloat16/float16) on the tables'
// CUDA device, hd even and the tables' 2 * (hd / 2) columns, tables.dtype float32 or q's, the
// positions on that device ([B, T] int64) or [start, start + T) within the tables' rows. Reads no
// device memory: the packed positions' values are the caller's contract.
bool fused_rotary_supports(const torch::Tensor& q, const torch::Tensor& k, const RotaryTables& r);

// {q, k} rotated as transformers' apply_rotary_pos_emb rotates them, x * cos + rotate_half(x) * sin
// with cos and sin of each token's position cast to r.dtype first: [B, T, Hq, hd] and
// [B, T, Hk, hd], contiguous, of the dtype q * cos promotes to (float32 with float32 tables, else
// q's). q and k are read in place through their strides (views of the projections' outputs).
std::pair<torch::Tensor, torch::Tensor> fused_rotary(const torch::Tensor& q, const torch::Tensor& k,
                                                     const RotaryTables& r);

}  // namespace trainer::nn
