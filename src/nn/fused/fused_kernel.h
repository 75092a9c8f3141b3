// The fused RMSNorm and SwiGLU kernels (nn/fused/fused_cuda.cu), forward and backward. No torch
// header: the kernels' file is compiled by nvcc alone; nn/fused/fused_ops.h wraps them in autograd
// functions. Every pointer is device memory of contiguous rows; every launch goes on CUDA stream
// `stream` (a cudaStream_t) and returns the CUDA error of the launch ("" when none).
#pragma once

#include <cstdint>

namespace trainer::nn {

// The element types the kernels read and write.
enum class FusedDtype { float32, bfloat16, float16 };

// RMSNorm of rows of width `cols`, transformers' LlamaRMSNorm: with s = x (+ r), in float32
// rstd = 1 / sqrt(mean(s^2) + eps), n = s * rstd cast to `dtype`, y = weight * n in `out_dtype`.
// Supported (dtype, weight_dtype): equal, or weight float32 (then out_dtype float32); otherwise
// out_dtype = dtype.
struct RmsNormForwardArgs {
  const void* x = nullptr;         // [rows, cols] of `dtype`
  const void* residual = nullptr;  // [rows, cols] of `dtype` added to x first; null: none
  const void* weight = nullptr;    // [cols] of `weight_dtype`
  void* sum = nullptr;             // [rows, cols] of `dtype`: x + residual (only with residual)
  void* y = nullptr;               // [rows, cols] of the output dtype
  float* rstd = nullptr;           // [rows] float32 out: 1 / sqrt(mean(s^2) + eps)
  int64_t rows = 0, cols = 0;
  float eps = 1e-5f;
  FusedDtype dtype = FusedDtype::float32, weight_dtype = FusedDtype::float32;
};

// The gradients of RmsNormForwardArgs' y: grad_x (of s, hence of x and of the residual) and the
// weight's, accumulated in float32 by `blocks` partial rows that the caller sums over.
struct RmsNormBackwardArgs {
  const void* grad_y = nullptr;    // [rows, cols] of the output dtype
  const void* grad_sum = nullptr;  // [rows, cols] of `dtype`, the sum's own gradient; null: none
  const void* s = nullptr;         // [rows, cols] of `dtype`: the normalised input (x + residual)
  const void* weight = nullptr;    // [cols] of `weight_dtype`
  const float* rstd = nullptr;     // [rows] from the forward
  void* grad_x = nullptr;          // [rows, cols] of `dtype` out
  float* grad_weight_partial = nullptr;  // [blocks, cols] float32 out
  int64_t rows = 0, cols = 0, blocks = 1;
  FusedDtype dtype = FusedDtype::float32, weight_dtype = FusedDtype::float32;
};

const char* launch_rms_norm_forward(const RmsNormForwardArgs& args, void* stream);
const char* launch_rms_norm_backward(const RmsNormBackwardArgs& args, void* stream);

// SwiGLU, out = silu(a) * b elementwise, each product rounded to `dtype` as ATen's silu and mul
// round theirs. Backward: grad_a = silu'(a) * (grad_out * b), grad_b = grad_out * silu(a).
struct SwigluArgs {
  const void* a = nullptr;         // [n] of `dtype` (the gate)
  const void* b = nullptr;         // [n] of `dtype` (the up projection)
  const void* grad_out = nullptr;  // backward: [n] of `dtype`
  void* out = nullptr;             // forward: [n] of `dtype`
  void* grad_a = nullptr;          // backward: [n] of `dtype`
  void* grad_b = nullptr;          // backward: [n] of `dtype`
  int64_t n = 0;
  FusedDtype dtype = FusedDtype::float32;
};

const char* launch_swiglu_forward(const SwigluArgs& args, void* stream);
const char* launch_swiglu_backward(const SwigluArgs& args, void* stream);

}  // namespace trainer::nn
