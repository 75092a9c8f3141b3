// Batch normalisation for the models: torch::nn::BatchNorm2d (same options, parameters, buffers
// and state-dict names), which in training can normalise over the global batch of a
// data-parallel job instead of this process's part of it (PyTorch's SyncBatchNorm).
#pragma once

#include <torch/nn/modules/batchnorm.h>

#include <functional>

namespace trainer::nn {

// Sums a tensor in place over every process of the job.
using AllReduceSum = std::function<void(torch::Tensor& tensor)>;

// How a batch norm reaches the other processes of a data-parallel job.
struct BatchNormSync {
  int rank = 0;        // this process
  int world_size = 1;  // processes whose batches form the global batch
  AllReduceSum sum;    // the sum over them
};

class BatchNorm2dImpl : public torch::nn::BatchNorm2dImpl {
 public:
  using torch::nn::BatchNorm2dImpl::BatchNorm2dImpl;

  // x: [N, C, H, W]. In training with a sync set (sync_batch_norm), the batch statistics are those
  // of every process's batch together, and gradients flow through them to every process: a
  // collective in forward and in backward, so every rank must run it, in the same order. With
  // momentum unset (a cumulative average), synchronises the device to read the batch count.
  torch::Tensor forward(const torch::Tensor& x);

  // Normalise over the global batch (sync.sum empty: this process's batch).
  void set_sync(BatchNormSync sync) { sync_ = std::move(sync); }

 private:
  BatchNormSync sync_;
};
TORCH_MODULE(BatchNorm2d);

// Sets `sync` on every nn::BatchNorm2d in `model`; returns how many there are.
int64_t sync_batch_norm(torch::nn::Module& model, const BatchNormSync& sync);

}  // namespace trainer::nn
