// Training losses, registered by the YAML `train.loss`.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>

#include "config/config.h"
#include "config/registry.h"

namespace trainer::losses {

// A target left out of the loss (PyTorch's ignore_index; data::kIgnoreTarget).
constexpr int64_t kIgnoreIndex = -100;

// Mean loss of a batch: logits [B, K] and targets [B] int64, or for sequences logits [B, T, K]
// and targets [B, T] (the mean over all B * T tokens) -> scalar. Targets equal to kIgnoreIndex
// are left out: the mean is over the others, as PyTorch's cross_entropy takes it, and 0 (with
// zero gradients) when there are none.
using Loss =
    std::function<torch::Tensor(const torch::Tensor& logits, const torch::Tensor& targets)>;
using LossFactory = std::function<Loss(const config::TrainConfig& cfg)>;
using LossRegistry = Registry<LossFactory>;

// cross_entropy (with train.label_smoothing).
const LossRegistry& loss_registry();

}  // namespace trainer::losses
