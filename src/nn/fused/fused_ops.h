// Autograd functions over the fused CUDA kernels of nn/fused/fused_kernel.h: RMSNorm (optionally
// after the residual add) and SwiGLU, each one kernel forward and one backward. Each `*_supports`
// says whether its function takes these tensors (on a CUDA device, of a dtype the kernels have, in
// a build with them); the callers keep their ATen composition otherwise (always on the CPU).
#pragma once

#include <torch/torch.h>

#include <utility>

namespace trainer::nn {

// True in a build with the kernels (LibTorch with CUDA and nvcc).
bool fused_kernels_built();

// x [..., D] of float32/bfloat16/float16 on a CUDA device; weight [D] of x's dtype or float32.
bool fused_rms_norm_supports(const torch::Tensor& x, const torch::Tensor& weight);
// transformers' LlamaRMSNorm: weight * (x / sqrt(mean(x^2) + eps) in float32, cast to x's dtype),
// in the dtype weight * x promotes to: [..., D].
torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
// x and residual of one shape, their sum of a dtype fused_rms_norm_supports with weight.
bool fused_add_rms_norm_supports(const torch::Tensor& x, const torch::Tensor& residual,
                                 const torch::Tensor& weight);
// {s, fused_rms_norm(s, weight, eps)} with s = x + residual, in one kernel: the sum for the next
// residual and the normalised sum, [..., D] each. x and residual of different dtypes are cast to
// the dtype their sum promotes to first.
std::pair<torch::Tensor, torch::Tensor> fused_add_rms_norm(const torch::Tensor& x,
                                                           const torch::Tensor& residual,
                                                           const torch::Tensor& weight, double eps);

// a and b of one shape and dtype (float32/bfloat16/float16) on a CUDA device.
bool fused_swiglu_supports(const torch::Tensor& a, const torch::Tensor& b);
// silu(a) * b, as ATen's silu and mul round it: the shape of a.
torch::Tensor fused_swiglu(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace trainer::nn
