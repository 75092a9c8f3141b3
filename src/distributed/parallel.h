// What a training step calls around its micro-batches, whatever the data-parallel strategy
// (distributed/ddp.h: replicated weights; distributed/fsdp.h: sharded ones):
//
//   for each micro-batch m (sync = the last one):
//     before_forward(/*first=*/m == 0, sync);  forward;  after_forward(loss, sync);
//     backward;
//   after_backward();   // the gradients the optimizer updates with are now averaged over ranks
//
// Micro-batches with sync false only accumulate gradients locally (DDP's no_sync).
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace trainer::distributed {

class DataParallelism {
 public:
  virtual ~DataParallelism() = default;
  // Every rank must call this, in the same order.
  virtual void before_forward(bool first, bool sync) = 0;
  // `loss` is the micro-batch's loss, which backward starts from. Every rank must call this, in
  // the same order; the backward that follows runs collectives, so every rank must run it too.
  virtual void after_forward(const torch::Tensor& loss, bool sync) = 0;
  // Waits for the last collectives of the step. Every rank must call this, in the same order.
  virtual void after_backward() = 0;
};

}  // namespace trainer::distributed
