// Activation checkpointing: a segment of the network that keeps none of its intermediate
// activations in forward and recomputes them in backward, trading compute for memory.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace trainer::nn {

using TensorList = std::vector<torch::Tensor>;
using SegmentFn = std::function<TensorList(const TensorList& inputs)>;

// Runs `fn(inputs)` (kept until backward: capture what it uses by value) through an autograd
// function that saves only `inputs`. Backward runs `fn` again with the forward's random-number
// state (the CPU generator and the CUDA generators of the inputs' devices) and autocast settings,
// then backpropagates through the rerun; dropout masks and results are identical to the first run.
// `module` is the segment's owner: its parameters that require grad receive their gradients through
// the outputs (so inputs may all be constants), and its buffers (batch-norm running statistics) are
// put back after the rerun, so they are updated once per forward. Without grad mode, `fn(inputs)`
// runs as is. At least one output must be floating point.
//
// `offload`: the saved inputs leave for host memory (pinned, copied without blocking the host,
// on the current stream, from a CUDA device; a copy on the CPU) and come back to their device in
// backward before the rerun: the values, and so the results, are the same; offloaded_bytes()
// counts what left.
TensorList checkpoint(const torch::nn::Module& module, const SegmentFn& fn,
                      const TensorList& inputs, bool offload = false);

// The single-input, single-output form.
torch::Tensor checkpoint(const torch::nn::Module& module,
                         const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                         const torch::Tensor& input, bool offload = false);

// Bytes of saved inputs that checkpoint(..., offload) moved to host memory so far in this process.
int64_t offloaded_bytes();

// Which of a model's blocks to checkpoint, from config::checkpoint_period: 0 = none, N = every
// N-th block (1-based: blocks N, 2N, ...; 1 = all); `offload` (model.checkpointing: offload):
// their saved inputs held in host memory until backward.
class CheckpointPolicy {
 public:
  explicit CheckpointPolicy(int64_t period = 0, bool offload = false)
      : period_(period), offload_(offload) {}
  bool applies(int64_t block_index) const {  // block_index counts from 0
    return period_ > 0 && (block_index + 1) % period_ == 0;
  }
  bool any() const { return period_ > 0; }
  bool offload() const { return offload_; }

 private:
  int64_t period_;
  bool offload_;
};

}  // namespace trainer::nn
