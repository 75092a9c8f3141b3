#include "engine/step.h"

#include <torch/torch.h>

#include <cmath>

#include "nn/autocast.h"
#include "optim/clip.h"
#include "util/device.h"

namespace trainer::engine {
namespace {

void begin(StepObserver* observer, Phase phase) {
  if (observer) observer->begin(phase);
}

}  // namespace

void StepFlags::start(const torch::Tensor& loss, bool stop_requested, distributed::Group* group) {
  pending_.reset();
  agreed_ = torch::Tensor();
  if (!group || group->world_size() <= 1) return;
  // Summed over the ranks, the loss is inf/NaN when any rank's is, and the stop flag positive
  // when any rank was asked to stop.
  agreed_ = torch::stack({loss, torch::full({}, stop_requested ? 1.0 : 0.0, loss.options())});
  pending_ = group->all_reduce_async({agreed_}, distributed::Reduce::sum);
}

StepOutcome StepFlags::finish(const torch::Tensor& loss, const torch::Tensor& found_inf,
                              bool check_loss) {
  StepOutcome out{loss};
  if (pending_) pending_->wait();
  const bool agreeing = agreed_.defined();
  if (!agreeing && !found_inf.defined() && !check_loss) return out;
  // One host copy: the loss (summed over the ranks), the stop flags when agreeing, found_inf.
  torch::Tensor flags = agreeing ? agreed_ : loss;
  if (found_inf.defined()) flags = torch::cat({flags.reshape({-1}), found_inf.reshape({1})});
  auto host = read_to_host(flags);
  if (host.scalar_type() != torch::kFloat) host = host.to(torch::kFloat);
  const float* f = host.data_ptr<float>();
  out.bad_loss = !std::isfinite(f[0]);
  out.stop = agreeing && f[1] > 0.0f;
  out.skipped = out.bad_loss || (found_inf.defined() && f[host.numel() - 1] != 0.0f);
  return out;
}

TrainStep::TrainStep(Components& parts, const config::TrainConfig& train, TrainingState& state)
    : parts_(parts), train_(train), state_(state) {}

StepOutcome TrainStep::run(const std::vector<data::Batch>& micro_batches, bool stop_requested,
                           StepObserver* observer) {
  const torch::Tensor loss = forward_backward(micro_batches, stop_requested, observer);
  begin(observer, Phase::grad_sync);
  if (auto* parallel = parts_.data_parallel()) parallel->after_backward();
  begin(observer, Phase::optimizer);
  return update(loss);
}

torch::Tensor TrainStep::forward_backward(const std::vector<data::Batch>& micro_batches,
                                          bool stop_requested, StepObserver* observer) {
  auto& p = parts_;
  distributed::DataParallelism* parallel = p.data_parallel();
  const double accum = static_cast<double>(micro_batches.size());
  // Gradients dropped (set to none) rather than zeroed; under DDP they are views of its buckets,
  // which zeroing cannot detach.
  for (auto& param : p.params) param.mutable_grad().reset();
  torch::Tensor step_loss;  // the sum of the micro-batches' losses / accum
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const bool sync = m + 1 == micro_batches.size();  // DDP averages on the last backward only
    begin(observer, Phase::forward);
    auto inputs = micro_batches[m].inputs.to(p.device, /*non_blocking=*/true);    // [B, ...]
    auto targets = micro_batches[m].targets.to(p.device, /*non_blocking=*/true);  // [B] or [B, T]
    if (parallel) parallel->before_forward(/*first=*/m == 0, sync);
    torch::Tensor loss;  // float32 scalar
    {
      nn::AutocastGuard autocast(p.device.type(), p.precision.dtype, p.precision.autocast);
      loss = p.loss(p.model->forward(inputs), targets);
      if (accum > 1) loss = loss / accum;
    }
    step_loss = m == 0 ? loss.detach() : step_loss + loss.detach();
    if (parallel) parallel->after_forward(loss, sync);
    if (sync) flags_.start(step_loss, stop_requested, p.group.get());
    begin(observer, Phase::backward);
    (p.scaler ? p.scaler->scale(loss) : loss).backward();
  }
  return step_loss;
}

StepOutcome TrainStep::update(const torch::Tensor& loss) {
  auto& p = parts_;
  const bool clip = train_.clip_grad_norm > 0;
  // A fused optimizer divides the gradients by the scale itself (as torch.amp does for
  // fused=True), unless clipping needs them unscaled before.
  const bool kernel_unscales = p.scaler && p.optimizer->takes_device_inputs() && !clip;
  torch::Tensor found_inf;
  if (p.scaler) {
    found_inf = kernel_unscales ? p.scaler->check(p.params) : p.scaler->unscale(p.params);
    // Sharded gradients: inf/NaN in any rank's shard skips the step everywhere.
    if (p.fsdp) found_inf = p.fsdp->reduce_over_shards(found_inf, distributed::Reduce::max);
  }
  // Decide, the same on every rank: skip the update on inf/NaN gradients (averaged, so equal on
  // every rank) or an inf/NaN loss on any rank.
  StepOutcome out = flags_.finish(loss, found_inf, train_.max_bad_steps > 0);
  if (!out.skipped) {
    optim::KernelInputs device;
    if (clip) {
      optim::SquaredNormSum over_shards;  // sharded gradients: the norm over every rank's
      if (p.fsdp) {
        over_shards = [&p](const torch::Tensor& squared) {
          return p.fsdp->reduce_over_shards(squared, distributed::Reduce::sum);
        };
      }
      optim::clip_for_step(*p.optimizer, p.params, train_.clip_grad_norm, device, over_shards);
    }
    if (kernel_unscales) device.grad_scale = p.scaler->scale_tensor();
    p.optimizer->step(p.schedule->lr(state_.updates()), device);
  } else {
    ++state_.skipped_steps;
  }
  if (p.scaler) p.scaler->update(found_inf);
  ++state_.step;
  return out;
}

}  // namespace trainer::engine
