// The rows of a softmax cross-entropy: each row's loss, and in training its gradient written
// over the logits. Shared by the cross-entropy loss (losses/loss.h) and the output layer's
// chunked loss (losses/output_loss.h).
#pragma once

#include <torch/types.h>

namespace trainer::losses {

// True in a build with the CUDA kernel (losses/xent_cuda.cu).
bool xent_kernel_built();

// Logits x [N, K] (rows at least K elements apart, the last dimension contiguous; x's own memory)
// and targets t [N] int64 in [0, K): each row's loss with label smoothing `smoothing`,
// (1 - s) * (lse - x[t]) + s * (lse - mean(x)), [N] float32 (float64 for float64 logits). With
// `training`, x's rows are overwritten by their gradients, softmax(x) - (1 - s) * onehot(t) - s / K
// (unscaled: the caller multiplies by each row's share of the mean). On a GPU one fused kernel
// reads each logit twice and writes it once; on the CPU blocks of rows go through float32.
torch::Tensor softmax_xent_rows(torch::Tensor& x, const torch::Tensor& t, double smoothing,
                                bool training);

}  // namespace trainer::losses
