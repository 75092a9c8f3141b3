// A language model's output layer and its cross-entropy in one, over rows of tokens at a time, so
// that the logits of the whole batch are never held (Liger-Kernel's fused linear cross-entropy).
#pragma once

#include <torch/types.h>

#include <functional>

#include "config/config.h"

namespace trainer::losses {

// The mean loss of logits = hidden · weightᵀ against targets, from hidden [N, C], weight [V, C]
// and targets [N] int64 (kIgnoreIndex rows left out, as Loss takes them) -> float32 scalar.
using OutputLoss = std::function<torch::Tensor(
    const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets)>;

// train.loss's OutputLoss; null when that loss has none (it takes only logits).
OutputLoss output_loss(const config::TrainConfig& cfg);

// cross_entropy (label smoothing `smoothing`) of hidden · weightᵀ, computed `chunk_rows` rows at a
// time (0: as many rows as make a chunk of logits about the size of `hidden`, Liger's rule, and
// at least an eighth of the rows).
// Forward computes each chunk's logits (in autocast's dtype when autocast is on for hidden's
// device, as linear computes them; the rows 64-element aligned, nn/aligned_linear.h), their loss
// and their gradients, and keeps only the gradients of hidden [N, C] (in hidden's dtype) and of
// weight [V, C] (in weight's dtype, summed in float32 over the chunks); backward scales them by
// the incoming gradient. Equal to cross_entropy(aligned_linear(hidden, weight), targets) within
// the rounding of the logits' dtype. Float16 logits are not taken (their gradients, divided by the
// number of tokens before any loss scaling, would underflow): callers keep the unfused path there.
torch::Tensor chunked_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                           const torch::Tensor& targets, double smoothing,
                                           int64_t chunk_rows = 0);

// The dtype the output layer's product runs in: autocast's on hidden's device, as it runs
// linear's; otherwise the inputs' common one.
torch::ScalarType product_type(const torch::Tensor& hidden, const torch::Tensor& weight);

}  // namespace trainer::losses
