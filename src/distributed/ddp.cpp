#include "distributed/ddp.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <limits>
#include <unordered_map>

namespace trainer::distributed {
namespace {

int64_t mib(double megabytes) {
  return static_cast<int64_t>(megabytes * 1024.0 * 1024.0);
}

// The all-reduce of a group of one: the bucket as it is, complete at once (no hand-off to the
// backend's threads). The future names the bucket's device, so that on a GPU it is ready in
// stream order.
class OneRankHook final : public c10d::CommHookInterface {
 public:
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    const at::Tensor& buffer = bucket.getBufferRef();
    std::vector<c10::Device> devices;
    if (!buffer.is_cpu()) devices.push_back(buffer.device());
    auto done = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get(), devices);
    done->markCompleted(c10::IValue(buffer));
    return done;
  }
  at::Tensor parseHookResult(const c10::IValue& result) override { return result.toTensor(); }
};

}  // namespace

DataParallel::DataParallel(torch::nn::Module& model,
                           const std::vector<std::pair<std::string, torch::Tensor>>& params,
                           Group& group, const DdpOptions& options)
    : model_(model), group_(group), options_(options) {
  for (const auto& [name, p] : params) {
    if (!p.requires_grad()) continue;
    params_.push_back(p);
    names_.push_back(name);
  }
  for (const auto& b : model.buffers(/*recurse=*/true)) buffers_.push_back(b);
  if (params_.empty()) throw std::runtime_error("DDP: the model has no trainable parameters");
  for (const auto& p : params_) gradient_bytes_ += static_cast<int64_t>(p.nbytes());
  if (group.world_size() == 1 && !options.reducer_at_world_size_1) return;
  broadcast_state();

  // As torch.nn.parallel.DistributedDataParallel does: without unused-parameter detection, one
  // bucket for the first step, whose backward records the order in which gradients become ready;
  // then the reducer rebuilds the buckets in that order, a small first one and capped ones after.
  std::vector<size_t> limits;
  if (options.find_unused_parameters) {
    limits = {static_cast<size_t>(mib(options.first_bucket_mb)),
              static_cast<size_t>(mib(options.bucket_cap_mb))};
  } else {
    limits = {std::numeric_limits<size_t>::max()};
  }
  auto [buckets, bucket_limits] = c10d::compute_bucket_assignment_by_size(params_, limits);
  // Gradients come in roughly the reverse order of the parameters' definition.
  std::reverse(buckets.begin(), buckets.end());
  std::unordered_map<size_t, std::string> names;
  for (size_t i = 0; i < names_.size(); ++i) names[i] = names_[i];
  auto pg = c10::intrusive_ptr<c10d::ProcessGroup>::reclaim_copy(&group.c10d());
  reducer_ = std::make_shared<c10d::Reducer>(
      params_, std::move(buckets), std::move(pg), /*expect_sparse_gradients=*/std::vector<bool>{},
      /*bucket_bytes_cap=*/mib(options.bucket_cap_mb), options.find_unused_parameters,
      /*gradient_as_bucket_view=*/true,  // no copy back from the buckets after the all-reduce
      std::move(names),
      /*first_bucket_bytes_cap=*/mib(options.first_bucket_mb),
      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
      /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
  // As DistributedDataParallel does: the reducer keeps a weak reference to its logger.
  logger_ = std::make_shared<c10d::Logger>(reducer_);
  reducer_->set_logger(logger_);
  // Alone (reducer_at_world_size_1), there is nothing to average: the reducer's hooks and buckets
  // run as in a larger group, without a collective.
  if (group.world_size() == 1) reducer_->register_comm_hook(std::make_unique<OneRankHook>());
  const auto device = params_.front().device();
  logger_->set_construction_data_and_log(
      "trainer", device.is_cuda() ? std::vector<int>{device.index()} : std::vector<int>{},
      /*output_device=*/device.is_cuda() ? device.index() : -1, options.broadcast_buffers,
      /*has_sync_bn=*/false, /*static_graph=*/false);
}

DataParallel::~DataParallel() {
  logger_.reset();  // holds the reducer too
  reducer_.reset();
}

void DataParallel::broadcast_state() {
  if (group_.world_size() == 1) return;
  std::vector<torch::Tensor> state;
  for (const auto& p : model_.parameters(/*recurse=*/true)) state.push_back(p.detach());
  for (const auto& b : buffers_) state.push_back(b);
  torch::NoGradGuard no_grad;
  group_.broadcast(state, /*root=*/0);
}

void DataParallel::before_forward(bool first, bool sync) {
  if (!reducer_) return;
  if (sync) reducer_->prepare_for_forward();
  // After the first step: buckets in the order gradients became ready (a collective; a no-op
  // once done).
  reducer_->rebuild_buckets();
  if (first && options_.broadcast_buffers && !buffers_.empty()) {
    torch::NoGradGuard no_grad;
    group_.broadcast(buffers_, /*root=*/0);
  }
}

void DataParallel::after_forward(const torch::Tensor& loss, bool sync) {
  if (!sync || !reducer_) return;
  if (group_.world_size() > 1) group_.record_all_reduce(gradient_bytes_);
  reducer_->prepare_for_backward(options_.find_unused_parameters ? std::vector<torch::Tensor>{loss}
                                                                 : std::vector<torch::Tensor>{});
}

void DataParallel::after_backward() {
  if (reducer_) {
    try {
      reducer_->check_finalized();
      return;
    } catch (const c10::Error&) {
      throw_unused(/*reducing=*/true);
    }
  }
  // Alone: the check a reducer makes in a larger group.
  if (options_.find_unused_parameters) return;
  for (const auto& p : params_) {
    if (!p.grad().defined()) throw_unused(/*reducing=*/false);
  }
}

void DataParallel::throw_unused(bool reducing) const {
  std::string unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].grad().defined()) continue;
    unused += (unused.empty() ? "" : ", ") + names_[i];
  }
  throw std::runtime_error(
      std::string(reducing ? "DDP: the gradient reduction did not finish because parameter(s) "
                           : "DDP: parameter(s) ") +
      (unused.empty() ? std::string("of the model") : unused) +
      " got no gradient in this step; set dist.find_unused_parameters: true when the model "
      "leaves parameters unused in some steps");
}

int64_t DataParallel::buckets() const {
  if (!reducer_) return 0;
  return static_cast<int64_t>(reducer_->get_grad_buckets(/*return_zero_tensors=*/false).size());
}

}  // namespace trainer::distributed
