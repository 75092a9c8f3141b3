// Fully sharded data parallel training (ZeRO-3, PyTorch FSDP's semantics) on c10d collectives.
//
// The model's parameters are grouped into units: one per block of the network (a transformer
// layer, a residual block) and the root unit holding the rest. Each unit's parameters live in one
// flat buffer, padded to a multiple of the world size; rank r keeps elements [r S, (r + 1) S) of
// it in float32 (its shard, S = padded / world size), the only copy that persists, and the
// optimizer updates the shards alone. The model's parameter tensors are views of the unit's
// gathered buffer, whose memory exists only while the unit is gathered:
//
//   forward:  the root is gathered before the model runs; each block is all-gathered just before
//             it runs (the next one already on its way, fsdp_prefetch) and freed after it
//             (reshard_after_forward), the root after the loss;
//   backward: a unit is gathered again when the gradient reaches its output, and once every
//             parameter of it has its gradient, those are reduce-scattered into the unit's
//             gradient shard (averaged over the ranks) and the gathered buffer freed.
//
// Parameters are gathered in `param_dtype` (bfloat16 under autocast) and gradients reduced in
// `reduce_dtype`, while shards and optimizer state stay float32, as FSDP2's MixedPrecisionPolicy.
//
// Frozen parameters (requires_grad false: a LoRA run's base) lie in a second flat buffer of their
// unit, sharded and gathered with it but never reduced, updated or saved: they are in no view,
// piece or load_parameters(), and keep their own dtype in the shard and when gathered (float32
// ones are gathered in param_dtype). In backward a block's frozen buffer is freed when the
// gradient reaches the block before it (the block's backward, which reads them to its end, is
// then done), the first block's and the root's after the backward.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distributed/parallel.h"
#include "distributed/process_group.h"
#include "nn/blocks.h"

namespace trainer::distributed {

struct FsdpOptions {
  bool reshard_after_forward = true;           // free gathered blocks after forward (ZeRO-3)
  c10::ScalarType param_dtype = c10::kFloat;   // gathered parameters' dtype
  c10::ScalarType reduce_dtype = c10::kFloat;  // gradients' dtype in the reduce-scatter
  bool prefetch = true;                        // gather the next unit while one computes
  // Where the parameters' values come from when set (a checkpoint's files) instead of rank 0's
  // tensors: fill(name, first, dst) writes elements [first, first + dst.numel()) of parameter
  // `name` flattened into `dst` (1-D, contiguous, the shard's dtype and device). Each rank then
  // fills only its own shard, nothing is broadcast and the parameters' memory is never read (it
  // may never have been written: nn/deferred_init.h, nn/init_replay.h). Used while the shards are
  // built, then dropped. Throws what `fill` throws.
  std::function<void(const std::string& name, int64_t first, const torch::Tensor& dst)> fill;
};

using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

// A contiguous part of this rank's shard of one unit whose elements share a weight-decay setting:
// what the optimizer updates as one tensor.
struct ShardView {
  std::string name;         // "fsdp.<unit>.decay" or "fsdp.<unit>.no_decay"
  torch::Tensor tensor;     // float32 view of the unit's shard
  bool decay = true;        // weight decay applies
  size_t unit = 0;          // the unit (0: root, i + 1: block i)
  int64_t flat_offset = 0;  // where tensor[0] lies in the unit's flat buffer
};

// Elements [offset, offset + data.numel()) of the flattened tensor `name` of `shape`.
struct Piece {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  torch::Tensor data;  // 1-D
};

class FullyShardedDataParallel final : public DataParallelism, public nn::BlockHooks {
 public:
  // `units[0]` are the root's parameters, `units[i + 1]` block i's, by name (each parameter once;
  // those that do not require gradients too). `decay(name)`: whether weight decay applies.
  // `group` null: a job of one (nothing communicated). The parameters may be on any device (the
  // host, so that the whole model never occupies the training device) and `model`'s buffers must
  // be on `device` already. Broadcasts rank 0's parameters and buffers, keeps this rank's shard
  // of each unit on `device` and makes the parameters views of the unit's gathered buffer there,
  // freed: from now on they may be read only while gathered (in forward and backward, between
  // gather_root() and release_root(), or through pieces()), and their former memory is released.
  // With options.fill, each rank's shards come from it instead (the buffers are still broadcast).
  // Every rank must construct it, in the same order.
  FullyShardedDataParallel(torch::nn::Module& model, std::vector<NamedParams> units,
                           const std::function<bool(const std::string&)>& decay, Group* group,
                           torch::Device device, const FsdpOptions& options);
  ~FullyShardedDataParallel() override;
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // The step's calls (distributed/parallel.h). Every rank must make each, in the same order: they
  // and the backward between them run all-gathers and reduce-scatters. After after_backward() on
  // a sync micro-batch the views' gradients are this step's, averaged over the ranks.
  void before_forward(bool first, bool sync) override;
  void after_forward(const torch::Tensor& loss, bool sync) override;
  void after_backward() override;

  // The model's block hooks (installed with NetImpl::set_block_hooks).
  void before_block(int64_t index) override;
  void after_block(int64_t index, const torch::Tensor& output) override;

  // `value` (a scalar of this rank's shards; undefined: zero) reduced in place over the ranks,
  // for what depends on every shard: the gradient norm, inf/NaN in the gradients. Every rank must
  // call this, in the same order.
  torch::Tensor reduce_over_shards(const torch::Tensor& value, Reduce op);

  // Gathers the root unit and keeps it (blocks come and go as in forward): for running the model
  // outside a training step (evaluation). Every rank must call these, in the same order.
  void gather_root();
  void release_root();

  // What the optimizer updates, in unit order.
  const std::vector<ShardView>& views() const { return views_; }

  // This rank's pieces of every parameter (views of the shards).
  std::vector<Piece> parameter_pieces() const;
  // This rank's pieces of `field`, a tensor laid out as views()[view] (its numel), under the
  // names "<parameter name>.<suffix>". A 0-dim `field` (a step count) is every parameter's whole.
  std::vector<Piece> view_pieces(size_t view, const torch::Tensor& field,
                                 const std::string& suffix) const;

  // The names of the parameters that views()[view] holds elements of.
  std::vector<std::string> view_parameters(size_t view) const;

  // Copies into the shards the elements of every parameter that this rank keeps, from
  // `full(name)` (the whole tensor, any dtype and device). Returns "" or the names missing or
  // mis-shaped, and then copies nothing.
  std::string load_parameters(const std::function<torch::Tensor(const std::string&)>& full) const;
  // views()[view]'s part of the per-parameter tensors `full(name)` (undefined when `full` has
  // none for one of its parameters), as one float32 tensor on the shard's device.
  torch::Tensor view_from_full(size_t view,
                               const std::function<torch::Tensor(const std::string&)>& full) const;

  // Counted as the gathered (padded) buffers' sizes of the all-gathers and reduce-scatters: per
  // step 3x the parameters' bytes with reshard_after_forward, 2x without.
  // The model's parameter bytes in param_dtype, padded as communicated.
  int64_t padded_parameter_bytes() const;
  int64_t units() const { return static_cast<int64_t>(units_.size()); }

  struct Unit;

 private:
  std::unique_ptr<Unit> build_unit(size_t index, NamedParams params,
                                   const std::function<bool(const std::string&)>& decay,
                                   bool frozen);
  // This rank's shard [S] of `u` in `dtype`, its elements from options_.fill.
  torch::Tensor filled_shard(const Unit& u, c10::ScalarType dtype) const;
  void register_grad_hooks(size_t unit);
  void start_gather(size_t unit);  // the unit's trainable and frozen buffers
  void wait_gather(size_t unit);
  void start_gather(Unit& u);
  void wait_gather(Unit& u);
  void reshard(Unit& u);
  void reshard(size_t unit);
  void on_gradient(size_t unit);
  void start_reduce(size_t unit);
  void finish_reduce(size_t unit);

  Group* group_;
  int world_ = 1;
  int rank_ = 0;
  torch::Device device_{torch::kCPU};
  FsdpOptions options_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<std::unique_ptr<Unit>> frozen_;  // each unit's frozen parameters; null: none
  std::vector<ShardView> views_;
  bool sync_ = true;  // this micro-batch's backward reduces its gradients
  bool root_held_ = false;
};

}  // namespace trainer::distributed
