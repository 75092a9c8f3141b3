// Training losses, registered by the YAML `train.loss`.
#pragma once

#include <torch/types.h>

#include <functional>

#include "config/config.h"
#include "config/registry.h"

namespace trainer::losses {

// Mean loss of a batch: logits [B, K] and targets [B] int64, or for sequences logits [B, T, K]
// and targets [B, T] (the mean over all B * T tokens) -> scalar.
using Loss =
    std::function<torch::Tensor(const torch::Tensor& logits, const torch::Tensor& targets)>;
using LossFactory = std::function<Loss(const config::TrainConfig& cfg)>;
using LossRegistry = Registry<LossFactory>;

// cross_entropy (with train.label_smoothing).
const LossRegistry& loss_registry();

}  // namespace trainer::losses
