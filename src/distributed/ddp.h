// Data-parallel training in the manner of PyTorch's DistributedDataParallel, driving c10d's own
// Reducer: parameters and buffers broadcast from rank 0 at the start; gradients averaged in
// byte-capped buckets, each all-reduced from autograd hooks as soon as it fills, in the same
// order on every rank, overlapping the rest of the backward pass.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "distributed/parallel.h"
#include "distributed/process_group.h"

namespace c10d {
class Logger;
class Reducer;
}  // namespace c10d

namespace trainer::distributed {

struct DdpOptions {
  double bucket_cap_mb = 25.0;           // bucket size after the first
  double first_bucket_mb = 1.0;          // the first bucket: the last layers' gradients, sent early
  bool find_unused_parameters = false;   // traverse the graph each step for unused parameters
  bool broadcast_buffers = true;         // rank 0's buffers to every rank before each step
  bool reducer_at_world_size_1 = false;  // the reducer in a group of one too (to measure it)
};

// Wraps the calls one training step makes around its micro-batches:
//
//   for each micro-batch m (sync = the last one):
//     ddp.before_forward(/*first=*/m == 0, sync);  forward;  ddp.after_forward(loss, sync);
//     backward;
//   ddp.after_backward();                            // gradients are now averaged over ranks
//
// Micro-batches with sync false only accumulate gradients locally (DDP's no_sync). After the
// last backward the parameters' gradients are views into the reducer's buckets: clear them by
// resetting (`p.mutable_grad().reset()`); Optimizer::zero_grad cannot detach views.
//
// In a group of one there is nothing to broadcast or average: unless `reducer_at_world_size_1`, no
// reducer is built (as torchtitan and Lightning train one process without the DDP wrapper), the
// gradients stay autograd's own, and only the unused-parameter check remains, so that a model
// fails alone as it would in a larger group.
class DataParallel final : public DataParallelism {
 public:
  // Every rank must construct it, in the same order (a collective).
  // Broadcasts `model`'s parameters and buffers from rank 0 and registers the reducer's hooks on
  // the gradient accumulators of `params`: the model's parameters by name, each once (shared ones
  // under one name); those that require gradients are averaged.
  DataParallel(torch::nn::Module& model,
               const std::vector<std::pair<std::string, torch::Tensor>>& params, Group& group,
               const DdpOptions& options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // With broadcast_buffers, sends rank 0's buffers to every rank before the first micro-batch.
  // Every rank must call this, in the same order.
  void before_forward(bool first, bool sync) override;
  // Arms the reducer for the backward pass of `loss` when `sync`; that backward all-reduces the
  // gradients bucket by bucket, so every rank must run it, in the same order.
  void after_forward(const torch::Tensor& loss, bool sync) override;
  // Checks that the reduction finished; throws std::runtime_error naming the parameters that got
  // no gradient (and dist.find_unused_parameters) when it did not.
  // Every rank must call this, in the same order (it waits for the last bucket's all-reduce).
  void after_backward() override;
  // Every gradient's bytes per synchronising step (0 without a reducer: nothing is sent).

  // Rank 0's parameters and buffers to every rank (after loading a checkpoint on one rank).
  // Every rank must call this, in the same order.
  void broadcast_state();

  // Buckets of the current assignment (rebuilt after the first step in gradient order); 0 when
  // there is no reducer (a group of one).
  int64_t buckets() const;

 private:
  // Throws the message naming the parameters without a gradient (`reducing`: the reducer's
  // reduction was left unfinished by them).
  [[noreturn]] void throw_unused(bool reducing) const;

  torch::nn::Module& model_;
  Group& group_;
  DdpOptions options_;
  std::vector<torch::Tensor> params_;  // those the reducer averages, in the model's order
  std::vector<std::string> names_;     // their names
  std::vector<torch::Tensor> buffers_;
  std::shared_ptr<c10d::Reducer> reducer_;  // null in a group of one (see reducer_at_world_size_1)
  std::shared_ptr<c10d::Logger> logger_;    // the reducer reports to it (and needs one)
  int64_t gradient_bytes_ = 0;              // of every averaged gradient
};

}  // namespace trainer::distributed
