// What a training step computes in place of train.loss of the model's outputs (train.objective:
// dpo, engine/loop/preference_step.h): made by the loop, held by the components, its metrics read
// by observation.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"

namespace trainer::distributed {
class Group;  // distributed/process_group.h
}  // namespace trainer::distributed

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

  // Evaluation on a held-out split: the loss of one micro-batch (no gradient), its metrics added
  // to an evaluation window of their own (the training window is left as it is).
  virtual torch::Tensor eval_loss(models::NetImpl& model, const torch::Tensor& inputs,
                                  const torch::Tensor& targets) = 0;
  // The evaluation window's metrics, each the mean over its micro-batches as TRL's evaluate()
  // logs them, then the mean loss weighted by the micro-batches' items (`loss`) and their count
  // (`items`); a new evaluation window. With `group` (ddp's ranks) the sums are combined over the
  // ranks (one all-reduce, which every rank makes). One host read.
  struct EvalWindow {
    std::vector<std::pair<std::string, double>> metrics;
    double loss = 0.0;
    int64_t items = 0;
  };
  virtual EvalWindow take_eval_window(distributed::Group* group) = 0;
};

}  // namespace trainer::engine
