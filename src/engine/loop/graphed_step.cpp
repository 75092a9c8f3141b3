#include "engine/loop/graphed_step.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

#include "optim/clip.h"
#include "util/device.h"

namespace trainer::engine {
namespace {

class EagerGraph final : public StepGraph {
 public:
  void warm_up(const std::function<void()>& work) override { work(); }
  void capture(const std::function<void()>& work) override { work_ = work; }
  void replay() override { work_(); }

 private:
  std::function<void()> work_;
};

std::string shape_text(const torch::Tensor& t) {
  std::string out = "[";
  for (int64_t i = 0; i < t.dim(); ++i) out += (i ? ", " : "") + std::to_string(t.size(i));
  return out + "]";
}

}  // namespace

std::unique_ptr<StepGraph> eager_graph() {
  return std::make_unique<EagerGraph>();
}

GraphedStep::GraphedStep(Components& parts, const config::TrainConfig& train, TrainingState& state,
                         std::unique_ptr<StepGraph> graph, int64_t warmup, SpikeGuard* guard)
    : parts_(parts),
      train_(train),
      state_(state),
      guard_(guard),
      graph_(std::move(graph)),
      warmup_(warmup),
      eager_(parts, train, state, guard) {
  if (!parts.optimizer->takes_device_inputs()) {
    throw std::logic_error("a graphed step needs a fused optimizer");
  }
  lr_ = torch::zeros({}, torch::TensorOptions().device(parts.device));
}

Settled GraphedStep::run(const std::vector<data::Batch>& micro_batches, bool stop_requested,
                         StepObserver* observer) {
  // Eager steps first, in this process (a resumed run too): the first calls of cuDNN and cuBLAS
  // choose algorithms and allocate workspaces, which a capture must not.
  if (eager_steps_ < warmup_ && !captured_) {
    Settled out;
    graph_->warm_up([&] { out = eager_.run(micro_batches, stop_requested, observer); });
    if (!out.abandoned) ++eager_steps_;
    return out;
  }
  // The outcomes of the steps before: the learning rate of this one counts their skips.
  Settled settled;
  settled.outcomes = settle();
  for (const auto& o : settled.outcomes) {
    if (ends_run(o, state_, train_)) {
      settled.abandoned = true;
      return settled;
    }
  }
  if (observer) observer->begin(Phase::forward);
  copy_in(micro_batches);
  lr_.fill_(parts_.schedule->lr(state_.updates()));
  if (!captured_) {
    // What a first step would allocate, allocated outside the graph.
    parts_.optimizer->prepare_state();
    graph_->capture([this] { work(); });
    captured_ = true;
  }
  graph_->replay();
  if (observer) observer->begin(Phase::optimizer);
  add_to_window(state_, decided_);
  ++state_.step;
  flags_.queue(state_.step);
  return settled;
}

std::vector<StepOutcome> GraphedStep::settle() {
  std::vector<StepOutcome> out = eager_.settle();  // the last eager warm-up step's
  if (flags_.pending()) {
    out.push_back(flags_.read());
    count_outcome(out.back(), state_);
  }
  return out;
}

const torch::Tensor& GraphedStep::last_loss() const {
  return captured_ ? loss_ : eager_.last_loss();
}

void GraphedStep::copy_in(const std::vector<data::Batch>& micro_batches) {
  if (static_.empty()) {
    for (const auto& b : micro_batches) {
      static_.push_back(data::Batch{torch::empty_like(b.inputs, parts_.device),
                                    torch::empty_like(b.targets, parts_.device), 0});
      if (b.positions.defined()) {  // data.pack's, [B, T]
        static_.back().positions = torch::empty_like(b.positions, parts_.device);
      }
    }
  }
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const auto& b = micro_batches[m];
    if (b.inputs.sizes() != static_[m].inputs.sizes() ||
        b.targets.sizes() != static_[m].targets.sizes()) {
      throw std::runtime_error("train.cuda_graph: a batch of inputs " + shape_text(b.inputs) +
                               " after batches of " + shape_text(static_[m].inputs) +
                               "; a graphed step needs every batch of one shape (" +
                               "data.drop_last: true) or train.cuda_graph: false");
    }
    static_[m].inputs.copy_(b.inputs, /*non_blocking=*/true);
    static_[m].targets.copy_(b.targets, /*non_blocking=*/true);
    if (static_[m].positions.defined()) {
      static_[m].positions.copy_(b.positions, /*non_blocking=*/true);
    }
  }
}

void GraphedStep::work() {
  auto& p = parts_;
  const torch::Tensor loss = eager_.forward_backward(static_, false, nullptr);
  const bool clip = train_.clip_grad_norm > 0;
  // The fused kernel divides the gradients by the scale unless their norm (clipping, the spike
  // guard) needs them unscaled.
  const bool kernel_unscales = p.scaler && !computes_grad_norm(train_, guard_);
  const torch::Tensor found_inf = !p.scaler         ? torch::Tensor()
                                  : kernel_unscales ? p.scaler->check(p.params)
                                                    : p.scaler->unscale(p.params);
  const torch::Tensor norm = step_grad_norm(p, train_, guard_);
  // Skipped on the device: an inf/NaN gradient or loss, a spike.
  const auto decision = flags_.decide(loss, found_inf, train_.max_bad_steps > 0, guard_, norm);
  optim::KernelInputs in;
  in.lr = lr_;
  in.found_inf = decision.skip;
  if (clip) optim::clip_for_step(*p.optimizer, p.params, train_.clip_grad_norm, norm, in);
  if (kernel_unscales) in.grad_scale = p.scaler->scale_tensor();
  p.optimizer->step(/*lr=*/0.0, in);
  if (p.scaler) p.scaler->update(found_inf);
  loss_ = loss;
  decided_ = decision;
}

}  // namespace trainer::engine
