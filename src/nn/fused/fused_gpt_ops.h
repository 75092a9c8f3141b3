// Autograd functions over the gpt model's fused CUDA kernels (nn/fused/fused_gpt_kernel.h):
// LayerNorm (optionally after the residual add) and the MLP's bias add with the tanh-approximated
// GELU, each one kernel forward and one backward. Each `*_supports` says whether its function takes
// these tensors (on a CUDA device, of a dtype the kernels have, in a build with them); the
// callers keep their ATen composition otherwise (always on the CPU). The functions can run again
// on the same inputs (activation checkpointing's recomputation): they keep no state between calls.
#pragma once

#include <torch/torch.h>

#include <utility>

namespace trainer::nn {

// x [..., D] of float32/bfloat16/float16 on a CUDA device; weight [D] of x's dtype or float32;
// bias undefined (none) or [D] of the weight's dtype, on x's device.
bool fused_layer_norm_supports(const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias);
// ATen's layer_norm of x over its last dimension (statistics in float32, the biased variance):
// [..., D] in float32 when the weight is float32 (what autocast's float32 layer_norm gives for a
// narrower x, which it casts first), else in x's dtype.
torch::Tensor fused_layer_norm(const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, double eps);
// x and residual of one shape, their sum of a dtype fused_layer_norm_supports with weight and bias.
bool fused_add_layer_norm_supports(const torch::Tensor& x, const torch::Tensor& residual,
                                   const torch::Tensor& weight, const torch::Tensor& bias);
// {s, fused_layer_norm(s, weight, bias, eps)} with s = x + residual, in one kernel: the sum for
// the next residual and the normalised sum, [..., D] each. x and residual of different dtypes are
// cast to the dtype their sum promotes to first.
std::pair<torch::Tensor, torch::Tensor> fused_add_layer_norm(const torch::Tensor& x,
                                                             const torch::Tensor& residual,
                                                             const torch::Tensor& weight,
                                                             const torch::Tensor& bias, double eps);

// h [..., D] of float32/bfloat16/float16 on a CUDA device; bias undefined (none) or [D] of h's
// dtype on h's device.
bool fused_bias_gelu_supports(const torch::Tensor& h, const torch::Tensor& bias);
// torch::gelu(h + bias, "tanh") as ATen's add and gelu round it (h alone without a bias): the
// shape and dtype of h.
torch::Tensor fused_bias_gelu(const torch::Tensor& h, const torch::Tensor& bias);

}  // namespace trainer::nn
