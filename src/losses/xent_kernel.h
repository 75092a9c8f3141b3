// The fused softmax cross-entropy kernel (losses/xent_cuda.cu): the loss of every row of logits
// and, in the same pass over them, its gradient written in the logits' place. No torch header:
// the kernel's file is compiled by nvcc alone.
#pragma once

#include <cstdint>

namespace trainer::losses {

// The element types the kernel reads and writes.
enum class XentDtype { float32, bfloat16, float16 };

struct XentArgs {
  const void* logits = nullptr;      // [rows, cols] of `dtype`, rows `row_stride` elements apart
  void* grad = nullptr;              // where the gradient goes ([rows, cols], same layout and
                                     // dtype; may be `logits` itself); null: the loss only
  const int64_t* targets = nullptr;  // [rows] class indices in [0, cols)
  float* row_loss = nullptr;         // [rows] float32 losses out
  int64_t rows = 0, cols = 0, row_stride = 0;
  XentDtype dtype = XentDtype::float32;
  float smoothing = 0.0f;            // label smoothing
};

// Launches the kernel on CUDA stream `stream` (a cudaStream_t). Per row r with target t and
// lse = logsumexp(x_r): row_loss[r] = (1 - s) (lse - x_t) + s (lse - mean(x_r)), and
// grad[r, j] = softmax(x_r)_j - s / cols - (1 - s) [j == t] (the gradient of the row's loss),
// accumulated in float32. Returns the CUDA error of the launch ("" when none).
const char* launch_softmax_xent(const XentArgs& args, void* stream);

}  // namespace trainer::losses
