#include "engine/loop/preference_step.h"

#include <torch/torch.h>

#include "losses/loss.h"
#include "nn/lora.h"

namespace trainer::engine {
namespace {

// The model's per-row log-probabilities of `labels`: from its hidden states and output weight
// where it has one (no [B, T, V] logits held), else from its logits.
losses::SequenceLogps score(models::NetImpl& model, const torch::Tensor& inputs,
                            const torch::Tensor& labels, bool stats) {
  losses::SequenceLogpsOptions options;
  options.stats = stats;
  if (const auto weight = model.output_weight(); weight.defined()) {
    return losses::sequence_logps_linear(model.forward_hidden(inputs, {}), weight, labels, {},
                                         options);
  }
  return losses::sequence_logps(model.forward_packed(inputs, {}), labels, {}, options);
}

bool needs_reference(const losses::PreferenceOptions& o) {
  for (const auto type : o.types) {
    if (type == losses::PreferenceLoss::simpo || type == losses::PreferenceLoss::orpo) return false;
  }
  return true;
}

class PreferenceStep final : public Objective {
 public:
  explicit PreferenceStep(losses::PreferenceOptions options)
      : options_(std::move(options)), reference_(needs_reference(options_)) {}

  torch::Tensor loss(models::NetImpl& model, const torch::Tensor& inputs,
                     const torch::Tensor& targets) override {
    const auto labels = labels_from_targets(targets);
    losses::PreferenceInputs in;
    if (reference_) {  // PEFT's reference: the base with the adapters off, no gradient
      torch::NoGradGuard no_grad;
      nn::AdaptersOff off;
      in.reference = score(model, inputs, labels, /*stats=*/false).logps;
    }
    in.policy = score(model, inputs, labels, /*stats=*/true);
    auto result = losses::preference_loss(in, options_);
    add_to_window(result.metrics);
    return result.loss;
  }

  std::vector<std::pair<std::string, double>> take_window() override {
    std::vector<std::pair<std::string, double>> out;
    if (!sums_.defined() || batches_ == 0) return out;
    const auto host = sums_.to(torch::kCPU, torch::kDouble);  // the one host read
    const double* v = host.data_ptr<double>();
    for (size_t i = 0; i < names_.size(); ++i) {
      out.emplace_back(names_[i], v[i] / static_cast<double>(batches_));
    }
    sums_.zero_();
    batches_ = 0;
    return out;
  }

 private:
  // Adds one micro-batch's metrics to the window's sums on the device (one stack, one add).
  void add_to_window(const losses::PreferenceMetrics& metrics) {
    torch::NoGradGuard no_grad;
    const auto named = metrics.named();
    std::vector<torch::Tensor> values;
    if (names_.empty()) {
      for (const auto& [name, value] : named) names_.push_back(name);
    }
    for (const auto& [name, value] : named) values.push_back(value.to(torch::kDouble));
    const auto stacked = torch::stack(values);
    if (!sums_.defined()) sums_ = torch::zeros_like(stacked);
    sums_.add_(stacked);
    ++batches_;
  }

  losses::PreferenceOptions options_;
  bool reference_;
  std::vector<std::string> names_;  // the metrics' names, in the order of sums_
  torch::Tensor sums_;              // [names_] float64 on the device: the window's sums
  int64_t batches_ = 0;             // micro-batches summed in sums_
};

}  // namespace

losses::PreferenceOptions preference_options(const config::DpoConfig& dpo) {
  losses::PreferenceOptions o;
  o.types = {losses::parse_preference_loss(dpo.loss_type)};
  o.beta = dpo.beta;
  o.label_smoothing = dpo.label_smoothing;
  o.simpo_gamma = dpo.simpo_gamma;
  o.cpo_alpha = dpo.cpo_alpha;
  return o;
}

torch::Tensor labels_from_targets(const torch::Tensor& targets) {
  const auto first = torch::full({targets.size(0), 1}, losses::kIgnoreIndex, targets.options());
  return torch::cat({first, targets.narrow(1, 0, targets.size(1) - 1)}, 1);
}

std::shared_ptr<Objective> make_objective(const config::Config& cfg) {
  if (cfg.train.objective != "dpo") return nullptr;
  auto options = preference_options(cfg.dpo);
  losses::check_preference_options(options);
  return std::make_shared<PreferenceStep>(std::move(options));
}

}  // namespace trainer::engine
