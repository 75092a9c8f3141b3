// The fused kernels of the gpt model (nn/fused/fused_gpt_cuda.cu), forward and backward: LayerNorm,
// optionally after the residual add, and the MLP's bias add with the tanh-approximated GELU after
// it. No torch header: the kernels' file is compiled by nvcc alone; nn/fused/fused_gpt_ops.h wraps
// them in autograd functions. Every pointer is device memory of contiguous rows; every launch goes
// on CUDA stream `stream` (a cudaStream_t) and returns the CUDA error of the launch ("" when none).
#pragma once

#include <cstdint>

#include "nn/fused/fused_kernel.h"

namespace trainer::nn {

// LayerNorm of rows of width `cols` (ATen's layer_norm): with s = x (+ r), in float32 the row's
// mean and rstd = 1 / sqrt(mean((s - mean)^2) + eps), y = (s - mean) * rstd * weight (+ bias) in
// `out_dtype`. Supported (dtype, weight_dtype): equal (out_dtype = dtype), or weight float32 (then
// out_dtype float32: autocast's float32 layer_norm reading a narrower input). The bias, when
// there is one, is of `weight_dtype`.
struct LayerNormForwardArgs {
  const void* x = nullptr;         // [rows, cols] of `dtype`
  const void* residual = nullptr;  // [rows, cols] of `dtype` added to x first; null: none
  const void* weight = nullptr;    // [cols] of `weight_dtype`
  const void* bias = nullptr;      // [cols] of `weight_dtype`; null: none
  void* sum = nullptr;             // [rows, cols] of `dtype`: x + residual (only with residual)
  void* y = nullptr;               // [rows, cols] of the output dtype
  float* mean = nullptr;           // [rows] float32 out
  float* rstd = nullptr;           // [rows] float32 out
  int64_t rows = 0, cols = 0;
  float eps = 1e-5f;
  FusedDtype dtype = FusedDtype::float32, weight_dtype = FusedDtype::float32;
};

// The gradients of LayerNormForwardArgs' y: grad_x (of s, hence of x and of the residual), and
// the weight's and the bias's, accumulated in float32 by `blocks` partial rows that the caller
// sums over.
struct LayerNormBackwardArgs {
  const void* grad_y = nullptr;    // [rows, cols] of the output dtype
  const void* grad_sum = nullptr;  // [rows, cols] of `dtype`, the sum's own gradient; null: none
  const void* s = nullptr;         // [rows, cols] of `dtype`: the normalised input (x + residual)
  const void* weight = nullptr;    // [cols] of `weight_dtype`
  const float* mean = nullptr;     // [rows] from the forward
  const float* rstd = nullptr;     // [rows] from the forward
  void* grad_x = nullptr;          // [rows, cols] of `dtype` out
  float* grad_weight_partial = nullptr;  // [blocks, cols] float32 out
  float* grad_bias_partial = nullptr;    // [blocks, cols] float32 out; null: no bias
  int64_t rows = 0, cols = 0, blocks = 1;
  FusedDtype dtype = FusedDtype::float32, weight_dtype = FusedDtype::float32;
};

const char* launch_layer_norm_forward(const LayerNormForwardArgs& args, void* stream);
const char* launch_layer_norm_backward(const LayerNormBackwardArgs& args, void* stream);

// out = gelu_tanh(h + bias) over rows of width `cols`, the sum rounded to `dtype` as ATen's add
// rounds it, the GELU in float32 as ATen's: 0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3))).
// Backward: grad_h = gelu_tanh'(h + bias) * grad_out rounded to `dtype`, and the bias's gradient,
// the sum of grad_h over the rows, in float32 partial rows, one per group of rows, that the caller
// sums over. The rows are split into `row_groups` groups (1 to 65535), each read by its own blocks.
struct BiasGeluArgs {
  const void* h = nullptr;             // [rows, cols] of `dtype`
  const void* bias = nullptr;          // [cols] of `dtype`; null: none
  const void* grad_out = nullptr;      // backward: [rows, cols] of `dtype`
  void* out = nullptr;                 // forward: [rows, cols] of `dtype`
  void* grad_h = nullptr;              // backward: [rows, cols] of `dtype`
  float* grad_bias_partial = nullptr;  // backward: [row_groups, cols] float32 out; null: none
  int64_t rows = 0, cols = 0, row_groups = 1;
  FusedDtype dtype = FusedDtype::float32;
};

const char* launch_bias_gelu_forward(const BiasGeluArgs& args, void* stream);
const char* launch_bias_gelu_backward(const BiasGeluArgs& args, void* stream);

}  // namespace trainer::nn
