#include "engine/loop/preference_step.h"

#include <torch/torch.h>

#include <map>

#include "checkpoint/checkpoint.h"
#include "distributed/process_group.h"
#include "engine/setup/saved_part.h"
#include "losses/loss.h"
#include "nn/lora.h"
#include "util/log.h"

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

class PreferenceStep final : public Objective, public SavedPart {
 public:
  PreferenceStep(losses::PreferenceOptions options, distributed::Group* group)
      : options_(std::move(options)),
        reference_(needs_reference(options_)),
        group_(group && group->world_size() > 1 ? group : nullptr) {}

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
    if (!sums_.defined() || batches_ == 0 || names_.empty()) return out;
    const auto host = sums_.to(torch::kCPU, torch::kDouble);  // the one host read
    const double* v = host.data_ptr<double>();
    for (size_t i = 0; i < names_.size(); ++i) {
      out.emplace_back(names_[i], v[i] / static_cast<double>(batches_));
    }
    sums_.zero_();
    batches_ = 0;
    return out;
  }

  // The window (sums_ and batches_): a run resumed within it logs what an uninterrupted one does.
  std::string prefix() const override { return "dpo."; }

  checkpoint::NamedTensors tensors() const override {
    if (!sums_.defined()) return {};
    return {{"window", sums_}, {"window_batches", torch::full({}, batches_, torch::kLong)}};
  }

  void restore(const checkpoint::NamedTensors& saved, const std::string& path) override {
    const std::map<std::string, torch::Tensor> by_name(saved.begin(), saved.end());
    const auto sums = by_name.find("window"), batches = by_name.find("window_batches");
    if (sums == by_name.end() || batches == by_name.end()) return;  // an empty window
    if (sums->second.dim() != 1 || batches->second.numel() != 1) {
      throw checkpoint::CorruptCheckpoint(path + ": its dpo.window is not [metrics] and a count");
    }
    sums_ = sums->second.to(device_or_cpu(), torch::kDouble).clone();
    batches_ = batches->second.item<int64_t>();
  }

 private:
  torch::Device device_or_cpu() const { return sums_.defined() ? sums_.device() : torch::kCPU; }

  // One micro-batch's metrics [K] float64; with ddp TRL's values over the ranks' batches together
  // (gather_for_metrics): Σ value·weight / Σ weight over the ranks, one all-reduce of [2K].
  torch::Tensor batch_values(const losses::PreferenceMetrics& metrics) {
    const auto weighted = metrics.weighted();
    std::vector<torch::Tensor> values, weights;
    if (names_.empty()) {
      for (const auto& w : weighted) names_.push_back(w.name);
    }
    for (const auto& w : weighted) {
      values.push_back(w.value.to(torch::kDouble));
      if (group_) weights.push_back(w.weight.to(torch::kDouble));
    }
    auto stacked = torch::stack(values);
    if (!group_) return stacked;
    const auto weight = torch::stack(weights);
    auto both = torch::cat({stacked * weight, weight});
    group_->all_reduce({both}, distributed::Reduce::sum);
    const auto k = static_cast<int64_t>(values.size());
    const auto total = both.narrow(0, 0, k), count = both.narrow(0, k, k);
    return torch::where(count.gt(0), total / count.clamp_min(1e-300), torch::zeros_like(total));
  }

  // Adds one micro-batch's metrics to the window's sums on the device (one stack, one add).
  void add_to_window(const losses::PreferenceMetrics& metrics) {
    torch::NoGradGuard no_grad;
    const auto values = batch_values(metrics);
    if (sums_.defined() && (sums_.sizes() != values.sizes() || sums_.device() != values.device())) {
      if (sums_.sizes() != values.sizes()) {  // a checkpoint of another dpo.loss_type's metrics
        log::warn("dpo: the resumed metrics window holds other metrics; it starts afresh");
        sums_ = torch::Tensor();
        batches_ = 0;
      } else {
        sums_ = sums_.to(values.device());
      }
    }
    if (!sums_.defined()) sums_ = torch::zeros_like(values);
    sums_.add_(values);
    ++batches_;
  }

  losses::PreferenceOptions options_;
  bool reference_;
  distributed::Group* group_;       // ddp's ranks, whose metrics combine; null alone
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

std::shared_ptr<Objective> make_objective(const config::Config& cfg, distributed::Group* group) {
  if (cfg.train.objective != "dpo") return nullptr;
  auto options = preference_options(cfg.dpo);
  losses::check_preference_options(options);
  return std::make_shared<PreferenceStep>(std::move(options), group);
}

}  // namespace trainer::engine
