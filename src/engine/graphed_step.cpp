#include "engine/graphed_step.h"

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
                         std::unique_ptr<StepGraph> graph, int64_t warmup)
    : parts_(parts),
      train_(train),
      state_(state),
      graph_(std::move(graph)),
      warmup_(warmup),
      eager_(parts, train, state) {
  if (!parts.optimizer->takes_device_inputs()) {
    throw std::logic_error("a graphed step needs a fused optimizer");
  }
  lr_ = torch::zeros({}, torch::TensorOptions().device(parts.device));
}

StepOutcome GraphedStep::run(const std::vector<data::Batch>& micro_batches, bool stop_requested,
                             StepObserver* observer) {
  if (state_.step < warmup_ && !captured_) {
    StepOutcome out;
    graph_->warm_up([&] { out = eager_.run(micro_batches, stop_requested, observer); });
    return out;
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
  const auto host = read_to_host(flags_);
  const float* f = host.data_ptr<float>();
  StepOutcome out{flags_[0]};
  out.bad_loss = !std::isfinite(f[0]);
  out.skipped = f[1] != 0.0f;
  if (out.skipped) ++state_.skipped_steps;
  ++state_.step;
  return out;
}

void GraphedStep::copy_in(const std::vector<data::Batch>& micro_batches) {
  if (static_.empty()) {
    for (const auto& b : micro_batches) {
      static_.push_back(data::Batch{torch::empty_like(b.inputs, parts_.device),
                                    torch::empty_like(b.targets, parts_.device), 0});
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
  }
}

void GraphedStep::work() {
  auto& p = parts_;
  const torch::Tensor loss = eager_.forward_backward(static_, false, nullptr);
  const bool clip = train_.clip_grad_norm > 0;
  // The fused kernel divides the gradients by the scale unless clipping needs them unscaled.
  const bool kernel_unscales = p.scaler && !clip;
  const torch::Tensor found_inf = !p.scaler         ? torch::zeros({}, loss.options())
                                  : kernel_unscales ? p.scaler->check(p.params)
                                                    : p.scaler->unscale(p.params);
  // Skipped on the device: an inf/NaN gradient or loss.
  const torch::Tensor skip =
      torch::maximum(found_inf, loss.isfinite().logical_not().to(torch::kFloat));
  optim::KernelInputs in;
  in.lr = lr_;
  in.found_inf = skip;
  if (clip) optim::clip_for_step(*p.optimizer, p.params, train_.clip_grad_norm, in);
  if (kernel_unscales) in.grad_scale = p.scaler->scale_tensor();
  p.optimizer->step(/*lr=*/0.0, in);
  if (p.scaler) p.scaler->update(found_inf);
  flags_ = torch::stack({loss, skip});
}

}  // namespace trainer::engine
