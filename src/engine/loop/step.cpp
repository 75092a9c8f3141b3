#include "engine/loop/step.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "engine/loop/preference_step.h"
#include "engine/persist/tensor_parallel_state.h"
#include "nn/autocast.h"
#include "optim/clip.h"
#include "util/device.h"

namespace trainer::engine {
namespace {

void begin(StepObserver* observer, Phase phase) {
  if (observer) observer->begin(phase);
}

// The targets of host `targets` [B, T] that train (not kIgnoreIndex), counted on the host.
double trained_targets(const torch::Tensor& targets) {
  const auto t = targets.to(torch::kLong).contiguous();  // itself when it is already
  const int64_t* v = t.data_ptr<int64_t>();
  return static_cast<double>(
      std::count_if(v, v + t.numel(), [](int64_t id) { return id != losses::kIgnoreIndex; }));
}

// Language-model steps (targets [B, T]): what each micro-batch's mean loss is multiplied by, its
// trained targets (not kIgnoreIndex) over those of the whole step on every data-parallel rank,
// times the ranks (DDP and fsdp average their gradients). The averaged gradients are then those
// of the mean over every trained token of the step however the tokens fall into micro-batches
// and ranks, as transformers' Trainer (num_items_in_batch) and TRL normalise. Counted on the
// host from host batches (a graphed step's are on the device already: counted there) and summed
// over the data-parallel group by one all-reduce, started here and awaited by the first scale().
// Every rank of the group must construct it, in the same order.
class TokenShares {
 public:
  TokenShares(const std::vector<data::Batch>& micro_batches, const Components& parts)
      : ranks_(parts.data_parallel_size()) {
    on_host_ = std::all_of(micro_batches.begin(), micro_batches.end(),
                           [](const data::Batch& b) { return b.targets.device().is_cpu(); });
    torch::Tensor local;  // [] float64 on the device: a graphed step's count
    for (const auto& b : micro_batches) {
      if (on_host_) {
        host_.push_back(trained_targets(b.targets));
        host_total_ += host_.back();
      } else {
        device_.push_back(b.targets.ne(losses::kIgnoreIndex).sum().to(torch::kDouble));
        local = local.defined() ? local + device_.back() : device_.back();
      }
    }
    distributed::Group* group = ranks_ > 1 ? parts.data_group() : nullptr;
    if (!on_host_) total_ = local;
    if (!group) return;
    if (on_host_) {
      total_ = torch::full({}, host_total_,
                           torch::TensorOptions(torch::kDouble).device(group->device()));
    }
    pending_.emplace(group->all_reduce_async({total_}, distributed::Reduce::sum));
  }

  // `loss`, micro-batch m's mean, times its share; float32 as it is.
  torch::Tensor scale(const torch::Tensor& loss, size_t m) {
    if (pending_) {
      pending_->wait();
      pending_.reset();
      if (total_.is_cpu() && on_host_) {  // a host group's sum: the host's (no operator)
        host_total_ = *total_.data_ptr<double>();
        total_ = torch::Tensor();
      }
    }
    if (!total_.defined()) return loss * (host_[m] * ranks_ / std::max(host_total_, 1.0));
    const auto share = on_host_ ? total_.clamp_min(1).reciprocal() * (host_[m] * ranks_)
                                : device_[m] * ranks_ / total_.clamp_min(1);  // [] float64
    return loss * share.to(loss.device(), loss.scalar_type());
  }

 private:
  double ranks_;                       // the data-parallel ranks
  bool on_host_ = true;                // the batches' targets are on the host
  std::vector<double> host_;           // each micro-batch's trained targets (host batches)
  double host_total_ = 0;              // the step's, on this rank (then on every rank)
  std::vector<torch::Tensor> device_;  // each micro-batch's (a graphed step's), [] float64
  torch::Tensor total_;                // the step's as a tensor (to be) summed over the ranks
  std::optional<distributed::Pending> pending_;
};

}  // namespace

void StepFlags::start(const torch::Tensor& loss, bool stop_requested, distributed::Group* group) {
  reduce_.reset();
  agreeing_ = group && group->world_size() > 1;
  if (!agreeing_) return;
  torch::NoGradGuard no_grad;
  if (!agreed_.defined()) {
    agreed_ = torch::empty({2}, loss.options());
    at_.summed = agreed_[0];
    at_.stop_sum = agreed_[1];
  }
  // Summed over the ranks, the loss is inf/NaN when any rank's is, and the stop flag positive
  // when any rank was asked to stop.
  at_.summed.copy_(loss);
  at_.stop_sum.fill_(stop_requested ? 1.0 : 0.0);
  world_ = group->world_size();
  reduce_ = group->all_reduce_async({agreed_}, distributed::Reduce::sum);
}

void StepFlags::make_buffers(const torch::Tensor& loss, bool spikes) {
  const int64_t n = spikes ? 6 : 3;
  if (flags_.defined() && flags_.numel() == n) return;
  const auto opts = torch::TensorOptions(torch::kFloat).device(loss.device());
  flags_ = torch::zeros({n}, opts);  // slots a step does not write stay 0
  at_.stop = flags_[0];
  at_.bad = flags_[1];
  at_.skip = flags_[2];
  if (spikes) {
    at_.spike = flags_[3];
    at_.z = flags_.narrow(0, 4, 2);
  }
  kept_ = torch::zeros({3}, opts);
  at_.kept_loss = kept_[0];
  at_.kept_grad_norm = kept_[1];
  at_.zero = kept_[2];
  bad_mask_ = torch::zeros({}, opts.dtype(torch::kBool));
  host_ = torch::Tensor();  // queue() makes its copy of the new size
}

void StepFlags::mark_bad(const torch::Tensor& summed, const torch::Tensor& loss,
                         const torch::Tensor& grad_norm, Decision& d) {
  // Finite values pass nan_to_num unchanged: `summed` is inf/NaN exactly when it differs from
  // its nan_to_num (0 for inf and NaN), which alone is then the loss the window takes.
  at::nan_to_num_out(at_.kept_loss, summed, 0.0, 0.0, 0.0);
  d.kept_loss = at_.kept_loss;
  if (!agreeing_ && !grad_norm.defined()) {
    at::ne_out(at_.bad, at_.kept_loss, summed);
    return;
  }
  at::ne_out(bad_mask_, at_.kept_loss, summed);
  at_.bad.copy_(bad_mask_);
  // This rank's loss may be finite while another's is not.
  if (agreeing_) at::where_out(at_.kept_loss, bad_mask_, at_.zero, loss);
  if (grad_norm.defined()) {
    at::where_out(at_.kept_grad_norm, bad_mask_, at_.zero, grad_norm);
    d.kept_grad_norm = at_.kept_grad_norm;
  }
}

StepFlags::Decision StepFlags::decide(const torch::Tensor& loss, const torch::Tensor& found_inf,
                                      bool skip_bad, SpikeGuard* guard,
                                      const torch::Tensor& grad_norm) {
  if (reduce_) reduce_->wait();
  reduce_.reset();
  torch::NoGradGuard no_grad;
  make_buffers(loss, guard != nullptr);
  const auto& summed = agreeing_ ? at_.summed : loss;
  if (agreeing_) at_.stop.copy_(at_.stop_sum);
  // `skip` is `bad` itself unless found_inf or the guard joins it: then its own slot.
  Decision d{at_.bad, at_.bad, loss, grad_norm};
  // Without skip_bad (train.max_bad_steps: 0) an inf/NaN loss is no reason to skip: it reaches
  // the metrics window, whose log line ends the run; `bad` stays 0.
  if (skip_bad) mark_bad(summed, loss, grad_norm, d);
  if (found_inf.defined()) {
    at::maximum_out(at_.skip, at_.bad, found_inf);
    d.skip = at_.skip;
  }
  if (!guard) return d;
  torch::Tensor z;  // [2]: the loss's and the gradient norm's z-scores
  const auto spike =
      guard->check(agreeing_ ? summed / static_cast<double>(world_) : loss, grad_norm, z);
  at::maximum_out(at_.skip, d.skip, spike);
  d.skip = at_.skip;
  at_.spike.copy_(spike);
  at_.z.copy_(z);
  return d;
}

void StepFlags::queue(int64_t step) {
  if (!host_.defined()) {
    host_ = torch::empty({flags_.numel()},
                         torch::TensorOptions(torch::kFloat).pinned_memory(flags_.is_cuda()));
  }
  host_.copy_(flags_, /*non_blocking=*/true);
  if (flags_.is_cuda()) {
    if (!copied_) copied_.emplace(c10::DeviceType::CUDA);
    copied_->record(
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(flags_.device()));
  }
  pending_step_ = step;
}

StepOutcome StepFlags::read() {
  if (copied_) copied_->synchronize();
  const float* f = host_.data_ptr<float>();
  StepOutcome out;
  out.step = pending_step_;
  out.stop = f[0] > 0.0f;
  out.bad_loss = f[1] != 0.0f;
  // `skip` is written only when found_inf or a spike joins `bad`.
  out.skipped = f[1] != 0.0f || f[2] != 0.0f;
  if (host_.numel() > 3) {  // the spike guard's
    out.spike = f[3] != 0.0f;
    out.z_loss = f[4];
    out.z_grad_norm = f[5];
  }
  pending_step_ = -1;
  return out;
}

bool computes_grad_norm(const config::TrainConfig& train, const SpikeGuard* guard) {
  return train.clip_grad_norm > 0 || (guard && guard->checks_grad_norm());
}

torch::Tensor step_grad_norm(Components& parts, const config::TrainConfig& train,
                             const SpikeGuard* guard) {
  if (!computes_grad_norm(train, guard)) return {};
  if (parts.tp) return tensor_parallel_grad_norm(parts);
  optim::SquaredNormSum over_shards;  // sharded gradients: the norm over every rank's
  if (parts.fsdp) {
    over_shards = [&parts](const torch::Tensor& squared) {
      return parts.fsdp->reduce_over_shards(squared, distributed::Reduce::sum);
    };
  }
  return optim::grad_norm(parts.params, over_shards);
}

void add_to_window(TrainingState& state, const StepFlags::Decision& decision) {
  torch::NoGradGuard no_grad;
  const auto& loss = decision.kept_loss;
  if (!state.window_loss.defined()) state.window_loss = torch::zeros({}, loss.options());
  const auto& norm = decision.kept_grad_norm;
  if (!norm.defined()) {
    state.window_loss.add_(loss);
    return;
  }
  if (!state.window_grad_norm.defined()) state.window_grad_norm = torch::zeros_like(loss);
  at::_foreach_add_(std::vector<torch::Tensor>{state.window_loss, state.window_grad_norm},
                    std::vector<torch::Tensor>{loss, norm});
}

void count_outcome(const StepOutcome& outcome, TrainingState& state) {
  if (outcome.skipped) ++state.skipped_steps;
  if (outcome.spike) ++state.spike_skips;
  state.bad_steps_in_row = outcome.bad_loss ? state.bad_steps_in_row + 1 : 0;
}

bool ends_run(const StepOutcome& outcome, const TrainingState& state,
              const config::TrainConfig& train) {
  // With train.rollback_on_nan the run decides (Run::take): back to a checkpoint, or the end.
  return outcome.stop || (outcome.bad_loss && train.max_bad_steps > 0 && !train.rollback_on_nan &&
                          state.bad_steps_in_row >= train.max_bad_steps);
}

TrainStep::TrainStep(Components& parts, const config::TrainConfig& train, TrainingState& state,
                     SpikeGuard* guard)
    : parts_(parts), train_(train), state_(state), guard_(guard) {}

Settled TrainStep::run(const std::vector<data::Batch>& micro_batches, bool stop_requested,
                       StepObserver* observer) {
  const torch::Tensor loss = forward_backward(micro_batches, stop_requested, observer);
  begin(observer, Phase::grad_sync);
  if (auto* parallel = parts_.data_parallel()) parallel->after_backward();
  begin(observer, Phase::optimizer);
  // The previous step's flags, copied while this step's forward and backward were queued: its
  // outcome decides this step's learning rate (skipped steps do not advance the schedule) and
  // whether the run ends before this step's update.
  Settled settled;
  if (flags_.pending()) {
    settled.outcomes.push_back(flags_.read());
    count_outcome(settled.outcomes.back(), state_);
    if (ends_run(settled.outcomes.back(), state_, train_)) {
      settled.abandoned = true;
      return settled;
    }
  }
  update(loss);
  loss_ = loss;
  if (ready_) {  // decided on the host already (an optimizer that cannot skip on the device)
    settled.outcomes.push_back(*ready_);
    count_outcome(settled.outcomes.back(), state_);
    ready_.reset();
  }
  return settled;
}

namespace {

// The loss of one micro-batch: of the model's logits, or of its hidden states and output weight
// in one (without the logits of the whole batch) when the model asks for that.
torch::Tensor forward_loss(Components& p, const torch::Tensor& inputs,
                           const torch::Tensor& positions, const torch::Tensor& targets) {
  if (p.objective) return p.objective->loss(*p.model, inputs, targets);
  if (p.output_loss && targets.dim() > 1) {
    if (const auto weight = p.model->output_weight(); weight.defined()) {
      return p.output_loss(p.model->forward_hidden(inputs, positions), weight, targets);
    }
  }
  return p.loss(p.model->forward_packed(inputs, positions), targets);
}

}  // namespace

std::vector<StepOutcome> TrainStep::settle() {
  std::vector<StepOutcome> out;
  if (flags_.pending()) {
    out.push_back(flags_.read());
    count_outcome(out.back(), state_);
  }
  return out;
}

torch::Tensor TrainStep::forward_backward(const std::vector<data::Batch>& micro_batches,
                                          bool stop_requested, StepObserver* observer) {
  auto& p = parts_;
  distributed::DataParallelism* parallel = p.data_parallel();
  const double accum = static_cast<double>(micro_batches.size());
  // Gradients dropped (set to none) rather than zeroed; under DDP they are views of its buckets,
  // which zeroing cannot detach.
  for (auto& param : p.params) param.mutable_grad().reset();
  // The step's mean loss: of its samples (the micro-batches' means / accum), or a language
  // model's of its trained tokens (on each rank its tokens' share times the data-parallel ranks;
  // the ranks' average is the step's).
  torch::Tensor step_loss;
  std::optional<TokenShares> shares;  // targets [B, T]
  // An objective's loss is a mean over its micro-batch's own items (pairs): averaged over them.
  if (!micro_batches.empty() && micro_batches[0].targets.dim() > 1 && !p.objective) {
    shares.emplace(micro_batches, p);
  }
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const bool sync = m + 1 == micro_batches.size();  // DDP averages on the last backward only
    begin(observer, Phase::forward);
    auto inputs = micro_batches[m].inputs.to(p.device, /*non_blocking=*/true);    // [B, ...]
    auto targets = micro_batches[m].targets.to(p.device, /*non_blocking=*/true);  // [B] or [B, T]
    const auto& packed = micro_batches[m].positions;  // [B, T] (data.pack) or undefined
    const auto positions =
        packed.defined() ? packed.to(p.device, /*non_blocking=*/true) : torch::Tensor();
    if (parallel) parallel->before_forward(/*first=*/m == 0, sync);
    torch::Tensor loss;  // float32 scalar
    {
      nn::AutocastGuard autocast(p.device.type(), p.precision.dtype, p.precision.autocast);
      loss = forward_loss(p, inputs, positions, targets);
      if (shares) {
        loss = shares->scale(loss, m);
      } else if (accum > 1) {
        loss = loss / accum;
      }
    }
    step_loss = m == 0 ? loss.detach() : step_loss + loss.detach();
    if (parallel) parallel->after_forward(loss, sync);
    if (sync) flags_.start(step_loss, stop_requested, p.group.get());
    begin(observer, Phase::backward);
    (p.scaler ? p.scaler->scale(loss) : loss).backward();
  }
  return step_loss;
}

void TrainStep::update(const torch::Tensor& loss) {
  auto& p = parts_;
  const bool clip = train_.clip_grad_norm > 0;
  const bool fused = p.optimizer->takes_device_inputs();
  // A fused optimizer divides the gradients by the scale itself (as torch.amp does for
  // fused=True), unless their norm (clipping, the spike guard) needs them unscaled before.
  const bool kernel_unscales = p.scaler && fused && !computes_grad_norm(train_, guard_);
  torch::Tensor found_inf;
  if (p.scaler) {
    found_inf = kernel_unscales ? p.scaler->check(p.params) : p.scaler->unscale(p.params);
    // Sharded gradients: inf/NaN in any rank's shard skips the step everywhere.
    if (p.fsdp) found_inf = p.fsdp->reduce_over_shards(found_inf, distributed::Reduce::max);
    if (p.tp) {  // and in any part of a split layer
      found_inf = found_inf.contiguous().clone();
      p.tp_group->all_reduce({found_inf}, distributed::Reduce::max);
    }
  }
  const torch::Tensor norm = step_grad_norm(p, train_, guard_);
  // Decided on the device, the same on every rank: skip the update on inf/NaN gradients
  // (averaged, so equal on every rank), an inf/NaN loss on any rank, or a spike.
  const auto decision = flags_.decide(loss, found_inf, train_.max_bad_steps > 0, guard_, norm);
  // The window's losses on the device: those of steps whose loss is finite on every rank.
  add_to_window(state_, decision);
  const double lr = p.schedule->lr(state_.updates());
  ++state_.step;
  flags_.queue(state_.step);
  if (!fused) {  // the update happens on the host's decision: read the flags now (a host read)
    RECORD_FUNCTION(kHostRead, std::vector<c10::IValue>());
    host_reads_made().fetch_add(1, std::memory_order_relaxed);
    ready_ = flags_.read();
  }
  if (!ready_ || !ready_->skipped) {
    optim::KernelInputs device;
    if (fused) device.found_inf = decision.skip;
    if (clip) optim::clip_for_step(*p.optimizer, p.params, train_.clip_grad_norm, norm, device);
    if (kernel_unscales) device.grad_scale = p.scaler->scale_tensor();
    p.optimizer->step(lr, device);
  }
  if (p.scaler) p.scaler->update(found_inf);
}

}  // namespace trainer::engine
