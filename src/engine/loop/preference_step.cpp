#include "engine/loop/preference_step.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "distributed/process_group.h"
#include "engine/setup/saved_part.h"
#include "losses/loss.h"
#include "nn/lora.h"
#include "util/log.h"

namespace trainer::engine {
namespace {

// The model's per-row log-probabilities of `labels` (and of `full_labels` where defined): from
// its hidden states and output weight where it has one (no [B, T, V] logits held), else from its
// logits.
losses::SequenceLogps score(models::NetImpl& model, const torch::Tensor& inputs,
                            const torch::Tensor& labels, const torch::Tensor& full_labels,
                            bool stats) {
  losses::SequenceLogpsOptions options;
  options.stats = stats;
  if (const auto weight = model.output_weight(); weight.defined()) {
    return losses::sequence_logps_linear(model.forward_hidden(inputs, {}), weight, labels,
                                         full_labels, options);
  }
  return losses::sequence_logps(model.forward_packed(inputs, {}), labels, full_labels, options);
}

// ORPO's NLL labels: each row's tokens up to its last completion token (the prompt and the
// completion: TRL's input ids where the attention mask is 1), -100 in the padding after them.
// Rows are right-padded and end with their completion. No host read.
torch::Tensor prompt_and_completion(const torch::Tensor& inputs, const torch::Tensor& labels) {
  const auto position = torch::arange(labels.size(1), labels.options()).unsqueeze(0);  // [1, T]
  const auto labelled = labels.ne(losses::kIgnoreIndex).to(labels.scalar_type());
  const auto length = (labelled * (position + 1)).amax(1, /*keepdim=*/true);  // [B, 1]
  return inputs.to(labels.scalar_type()).masked_fill(position >= length, losses::kIgnoreIndex);
}

bool needs_reference(const losses::PreferenceOptions& o) {
  for (const auto type : o.types) {
    if (type == losses::PreferenceLoss::simpo || type == losses::PreferenceLoss::orpo) return false;
  }
  return true;
}

bool is_orpo(const losses::PreferenceOptions& o) {
  return o.types.size() == 1 && o.types.front() == losses::PreferenceLoss::orpo;
}

// The names of the metrics preference_loss gives for `o`, in PreferenceMetrics::weighted()'s
// order: those of one pair of placeholder values (host tensors, computed once).
std::vector<std::string> metric_names(const losses::PreferenceOptions& o) {
  torch::NoGradGuard no_grad;
  const auto two = torch::ones({2});
  losses::SequenceLogps p;
  p.logps = -two;
  p.tokens = p.labelled = p.full_tokens = two;
  p.full_logps = -two;
  p.mean_logit_sum = p.entropy_sum = p.top1 = two;
  p.logit_sum = p.last_logit_sum = two.to(torch::kDouble);
  p.positions = p.vocab = 2;
  losses::PreferenceInputs in{p, needs_reference(o) ? -two : torch::Tensor()};
  std::vector<std::string> names;
  for (const auto& w : losses::preference_loss(in, o).metrics.weighted()) names.push_back(w.name);
  return names;
}

// Full fine-tuning's reference (TRL's ref_model): a frozen copy of the model's parameters as they
// are when made, its memory a second copy of the weights (tied parameters once). A Swap puts the
// copy's values in the parameters (set_data: no copy of the weights) until it ends.
class FrozenCopy {
 public:
  explicit FrozenCopy(models::NetImpl& model) {
    torch::NoGradGuard no_grad;
    std::set<const c10::TensorImpl*> seen;
    for (const auto& p : model.parameters()) {
      if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
      params_.push_back(p);
      copies_.push_back(p.detach().clone());
    }
  }

  // The copy in the parameters while it lives. Autocast's cast cache is off meanwhile: it keys
  // the casts of parameters by the parameter, whatever values it holds.
  class Swap {
   public:
    explicit Swap(FrozenCopy& frozen)
        : frozen_(frozen), cache_(at::autocast::is_autocast_cache_enabled()) {
      at::autocast::set_autocast_cache_enabled(false);
      for (size_t i = 0; i < frozen_.params_.size(); ++i) {
        trained_.push_back(frozen_.params_[i].data());
        frozen_.params_[i].set_data(frozen_.copies_[i]);
      }
    }
    ~Swap() {
      for (size_t i = 0; i < trained_.size(); ++i) frozen_.params_[i].set_data(trained_[i]);
      at::autocast::set_autocast_cache_enabled(cache_);
    }
    Swap(const Swap&) = delete;
    Swap& operator=(const Swap&) = delete;

   private:
    FrozenCopy& frozen_;
    bool cache_;
    std::vector<torch::Tensor> trained_;  // the parameters' own values, put back at the end
  };

 private:
  std::vector<torch::Tensor> params_, copies_;
};

class PreferenceStep final : public Objective, public SavedPart {
 public:
  // `frozen`: full fine-tuning's reference (null: the base with the LoRA adapters off).
  PreferenceStep(losses::PreferenceOptions options, distributed::Group* group,
                 std::unique_ptr<FrozenCopy> frozen)
      : options_(std::move(options)),
        reference_(needs_reference(options_)),
        full_labels_(is_orpo(options_)),
        group_(group && group->world_size() > 1 ? group : nullptr),
        names_(metric_names(options_)),
        frozen_(std::move(frozen)) {}

  torch::Tensor loss(models::NetImpl& model, const torch::Tensor& inputs,
                     const torch::Tensor& targets) override {
    auto result = compute(model, inputs, targets);
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

  torch::Tensor eval_loss(models::NetImpl& model, const torch::Tensor& inputs,
                          const torch::Tensor& targets) override {
    torch::NoGradGuard no_grad;
    const auto result = compute(model, inputs, targets);
    const auto values = batch_values(result.metrics, /*group=*/nullptr);
    const double pairs = static_cast<double>(inputs.size(0) / 2);
    const auto loss = result.loss.to(torch::kDouble).reshape({1});
    // [metrics..., loss · pairs, pairs, 1]: TRL's eval_loss weighs each batch by its pairs.
    const auto tail = torch::tensor({pairs, 1.0}, values.options());
    const auto row = torch::cat({values, loss * pairs, tail});
    if (!eval_sums_.defined()) eval_sums_ = torch::zeros_like(row);
    eval_sums_.add_(row);
    return result.loss;
  }

  EvalWindow take_eval_window(distributed::Group* group) override {
    const auto k = static_cast<int64_t>(names_.size());
    auto sums = eval_sums_;
    eval_sums_ = torch::Tensor();
    if (group && group->world_size() > 1) {
      // A rank without validation batches joins with zeros.
      if (!sums.defined()) sums = torch::zeros({k + 3}, torch::dtype(torch::kDouble));
      sums = sums.to(group->device());
      group->all_reduce({sums}, distributed::Reduce::sum);
    }
    EvalWindow w;
    if (!sums.defined()) return w;
    const auto host = sums.to(torch::kCPU);  // the one host read
    const double* v = host.data_ptr<double>();
    const double pairs = v[k + 1], batches = v[k + 2];
    if (batches > 0) {
      for (int64_t i = 0; i < k; ++i) w.metrics.emplace_back(names_[i], v[i] / batches);
    }
    w.items = static_cast<int64_t>(std::llround(pairs));
    w.loss = pairs > 0 ? v[k] / pairs : 0.0;
    return w;
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

  // One micro-batch's loss and metrics: the reference's log-probabilities (no gradient) where the
  // loss type compares with one, then the policy's.
  losses::PreferenceResult compute(models::NetImpl& model, const torch::Tensor& inputs,
                                   const torch::Tensor& targets) {
    const auto labels = labels_from_targets(targets);
    const auto full = full_labels_ ? prompt_and_completion(inputs, labels) : torch::Tensor();
    losses::PreferenceInputs in;
    if (reference_ && frozen_) {  // a full fine-tune's: the frozen copy of the starting weights
      torch::NoGradGuard no_grad;
      FrozenCopy::Swap swap(*frozen_);
      in.reference = score(model, inputs, labels, {}, /*stats=*/false).logps;
    } else if (reference_) {  // PEFT's: the base with the adapters off
      torch::NoGradGuard no_grad;
      nn::AdaptersOff off;
      in.reference = score(model, inputs, labels, {}, /*stats=*/false).logps;
    }
    in.policy = score(model, inputs, labels, full, /*stats=*/true);
    return losses::preference_loss(in, options_);
  }

  // One micro-batch's metrics [K] float64; with `group` TRL's values over the ranks' batches
  // together (gather_for_metrics): Σ value·weight / Σ weight over the ranks, one all-reduce of
  // [2K].
  torch::Tensor batch_values(const losses::PreferenceMetrics& metrics, distributed::Group* group) {
    const auto weighted = metrics.weighted();
    std::vector<torch::Tensor> values, weights;
    for (const auto& w : weighted) {
      values.push_back(w.value.to(torch::kDouble));
      if (group) weights.push_back(w.weight.to(torch::kDouble));
    }
    auto stacked = torch::stack(values);
    if (!group) return stacked;
    const auto weight = torch::stack(weights);
    auto both = torch::cat({stacked * weight, weight});
    group->all_reduce({both}, distributed::Reduce::sum);
    const auto k = static_cast<int64_t>(values.size());
    const auto total = both.narrow(0, 0, k), count = both.narrow(0, k, k);
    return torch::where(count.gt(0), total / count.clamp_min(1e-300), torch::zeros_like(total));
  }

  // Adds one micro-batch's metrics to the window's sums on the device (one stack, one add).
  void add_to_window(const losses::PreferenceMetrics& metrics) {
    torch::NoGradGuard no_grad;
    const auto values = batch_values(metrics, group_);
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
  bool full_labels_;                // orpo: the NLL over the prompt and the completion
  distributed::Group* group_;       // ddp's ranks, whose metrics combine; null alone
  std::vector<std::string> names_;  // the metrics' names, in the order of sums_
  torch::Tensor sums_;              // [names_] float64 on the device: the window's sums
  int64_t batches_ = 0;             // micro-batches summed in sums_
  // [names_, loss · pairs, pairs, micro-batches] float64: the evaluation window's sums
  torch::Tensor eval_sums_;
  std::unique_ptr<FrozenCopy> frozen_;  // full fine-tuning's reference; null with LoRA
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

std::shared_ptr<Objective> make_objective(const config::Config& cfg, distributed::Group* group,
                                          models::NetImpl* model) {
  if (cfg.train.objective != "dpo") return nullptr;
  auto options = preference_options(cfg.dpo);
  losses::check_preference_options(options);
  std::unique_ptr<FrozenCopy> frozen;
  if (cfg.model.lora.rank <= 0 && needs_reference(options)) {
    if (!model)
      throw std::invalid_argument(
          "make_objective: a full fine-tune's reference needs "
          "the model (its frozen copy)");
    frozen = std::make_unique<FrozenCopy>(*model);
  }
  return std::make_shared<PreferenceStep>(std::move(options), group, std::move(frozen));
}

}  // namespace trainer::engine
