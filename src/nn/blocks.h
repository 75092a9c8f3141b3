// The blocks of a network (a transformer's layers, a ResNet's residual blocks): the units that
// activation checkpointing recomputes and that sharded training gathers one at a time.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>

#include "nn/activation_checkpoint.h"

namespace trainer::nn {

// What runs around each block's forward (distributed/fsdp.h gathers a block's parameters before
// it and releases them after).
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  // Block `index` (counting from 0 in forward order) is about to run.
  virtual void before_block(int64_t index) = 0;
  // Block `index` ran and produced `output`.
  virtual void after_block(int64_t index, const torch::Tensor& output) = 0;
};

// Runs a network's blocks: through activation checkpointing where the policy says so, between the
// hooks when there are any.
class BlockRunner {
 public:
  explicit BlockRunner(CheckpointPolicy policy = CheckpointPolicy()) : policy_(policy) {}

  // `fn(input)` as block `index`, owned by `block`.
  torch::Tensor run(int64_t index, const torch::nn::Module& block,
                    const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                    const torch::Tensor& input) const {
    if (hooks_) hooks_->before_block(index);
    torch::Tensor out =
        policy_.applies(index) ? checkpoint(block, fn, input, policy_.offload()) : fn(input);
    if (hooks_) hooks_->after_block(index, out);
    return out;
  }

  // Hooks around every block from now on (null: none); they must outlive the runs.
  void set_hooks(BlockHooks* hooks) { hooks_ = hooks; }

 private:
  CheckpointPolicy policy_;
  BlockHooks* hooks_ = nullptr;
};

}  // namespace trainer::nn
