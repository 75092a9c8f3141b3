// What a training step computes in place of train.loss of the model's outputs (train.objective:
// dpo, engine/loop/preference_step.h): made by the loop, held by the components, its metrics read
// by observation.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "models/model.h"

namespace trainer::engine {

// What a step computes in place of train.loss of the model's outputs and the targets.
class Objective {
 public:
  virtual ~Objective() = default;
  // The loss of one micro-batch, a float32 scalar the backward runs through; the step's loss is
  // the mean of its micro-batches'. `inputs`, `targets` [B, T] are on the model's device.
  virtual torch::Tensor loss(models::NetImpl& model, const torch::Tensor& inputs,
                             const torch::Tensor& targets) = 0;
  // The window's metrics (TRL's names, each the mean over the micro-batches since the last call),
  // then a new window. One host read.
  virtual std::vector<std::pair<std::string, double>> take_window() = 0;
};

}  // namespace trainer::engine
