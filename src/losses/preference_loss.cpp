// preference_loss (losses/preference.h): TRL 1.16's formulas, each cited at its file and line
// (relative to the installed trl package).
#include <torch/torch.h>

#include <cmath>
#include <stdexcept>
#include <tuple>

#include "losses/preference.h"

namespace trainer::losses {
namespace {

struct Pair {
  torch::Tensor chosen, rejected;
};

// Rows [2P] -> the chosen half and the rejected half (TRL's chunk(2, dim=0)).
Pair halves(const torch::Tensor& x) {
  auto c = x.chunk(2, /*dim=*/0);
  return {c[0], c[1]};
}

// TRL's `total / count if count > 0 else 0.0`, on the device.
torch::Tensor ratio_or_zero(const torch::Tensor& total, const torch::Tensor& count) {
  return torch::where(count.gt(0), total / count.clamp_min(1), torch::zeros_like(total));
}

const torch::Tensor& required(const torch::Tensor& t, const char* what) {
  if (!t.defined()) throw std::invalid_argument(std::string("preference_loss: ") + what);
  return t;
}

// The rewards and log-probability metrics every trainer logs the same way
// (dpo_trainer.py:1582-1601, cpo_trainer.py:894-905, orpo_trainer.py:853-859).
void reward_metrics(const Pair& rewards, const Pair& logps, PreferenceMetrics& m) {
  m.pairs = torch::full({}, static_cast<double>(rewards.chosen.size(0)),
                        rewards.chosen.options().dtype(torch::kFloat));
  m.rewards_chosen = rewards.chosen.mean();
  m.rewards_rejected = rewards.rejected.mean();
  m.rewards_accuracies = rewards.chosen.gt(rewards.rejected).to(torch::kFloat).mean();
  m.rewards_margins = (rewards.chosen - rewards.rejected).mean();
  m.logps_chosen = logps.chosen.detach().mean();
  m.logps_rejected = logps.rejected.detach().mean();
}

// One DPO loss type's per-pair loss (dpo_trainer.py:1387-1431, f_divergence_type "reverse_kl").
torch::Tensor dpo_per_pair(PreferenceLoss type, const Pair& logratios, const Pair& labelled,
                           const PreferenceOptions& o) {
  const auto delta = logratios.chosen - logratios.rejected;
  const double beta = o.beta, eps = o.label_smoothing;
  switch (type) {
    case PreferenceLoss::sigmoid:  // :1388
      return -torch::log_sigmoid(delta * beta);
    case PreferenceLoss::hinge:  // :1391
      return torch::relu(1 - delta * beta);
    case PreferenceLoss::ipo: {  // :1398-1404, the log-ratios over completion_mask.sum(1)
      const auto chosen = logratios.chosen / labelled.chosen.clamp_min(1.0);
      const auto rejected = logratios.rejected / labelled.rejected.clamp_min(1.0);
      return (chosen - rejected - 1 / (2 * beta)).pow(2);
    }
    case PreferenceLoss::robust: {  // :1429-1431
      const auto clean = -(1 - eps) * torch::log_sigmoid(delta * beta);
      const auto flipped = -eps * torch::log_sigmoid(-delta * beta);
      return (clean - flipped) / (1 - 2 * eps);
    }
    default:
      throw std::invalid_argument("preference_loss: " + preference_loss_name(type) +
                                  " is not a DPO loss type");
  }
}

// DPOTrainer._compute_loss (dpo_trainer.py:1285-1612) with use_weighting false, ld_alpha None and
// no auxiliary loss: log-probabilities summed over the completion, the reference's subtracted.
PreferenceResult dpo(const PreferenceInputs& in, const PreferenceOptions& o) {
  const auto& p = in.policy;
  const auto logps = halves(p.logps);
  const auto ref = halves(required(in.reference, "the DPO loss types need the reference's logps"));
  const Pair logratios{logps.chosen - ref.chosen, logps.rejected - ref.rejected};  // :1350-1351
  const auto labelled = halves(p.labelled);
  torch::Tensor loss;
  for (size_t i = 0; i < o.types.size(); ++i) {  // :1385-1528, the mean over pairs, weighted
    const double weight = o.weights.empty() ? 1.0 : o.weights[i];
    const auto term = dpo_per_pair(o.types[i], logratios, labelled, o).mean() * weight;
    loss = loss.defined() ? loss + term : term;
  }
  PreferenceResult r;
  r.loss = loss;
  auto& m = r.metrics;
  // :1582-1601: rewards β·(logπ − logπref), detached.
  const Pair rewards{logratios.chosen.detach() * o.beta, logratios.rejected.detach() * o.beta};
  reward_metrics(rewards, logps, m);
  if (p.mean_logit_sum.defined()) {
    const auto tokens = halves(p.tokens);
    const auto mean_logits = halves(p.mean_logit_sum);
    // :1552-1568: the per-token mean logits summed over the completion tokens over their count.
    m.logits_chosen = ratio_or_zero(mean_logits.chosen.sum(), tokens.chosen.sum());
    m.logits_rejected = ratio_or_zero(mean_logits.rejected.sum(), tokens.rejected.sum());
    // :1536-1546: entropy over every completion token; :1570-1580: top-1 accuracy on chosen.
    m.entropy = ratio_or_zero(p.entropy_sum.sum(), p.tokens.sum());
    m.mean_token_accuracy = ratio_or_zero(halves(p.top1).chosen.sum(), tokens.chosen.sum());
    m.chosen_tokens = tokens.chosen.sum().to(torch::kFloat);
    m.rejected_tokens = tokens.rejected.sum().to(torch::kFloat);
    m.tokens = p.tokens.sum().to(torch::kFloat);
  }
  return r;
}

// The length-averaged log-probabilities of the CPO and ORPO trainers' get_batch_logps
// (cpo_trainer.py:785-790, orpo_trainer.py:738-743): the sum over the count, not clamped.
Pair average_logps(const SequenceLogps& p) {
  return halves(p.logps / p.tokens);
}

// The mean of every logit of the chosen (rejected) rows at `positions` positions per row.
Pair logits_means(const Pair& sums, int64_t rows, int64_t positions, int64_t vocab) {
  const double count = static_cast<double>(rows) * positions * vocab;
  return {(sums.chosen.sum() / count).to(torch::kFloat),
          (sums.rejected.sum() / count).to(torch::kFloat)};
}

// CPOTrainer with loss_type "simpo" and alpha 0 (cpo_trainer.py:678-750, 865-917).
PreferenceResult simpo(const PreferenceInputs& in, const PreferenceOptions& o) {
  const auto& p = in.policy;
  const auto logps = average_logps(p);  // average_log_prob=True for simpo (:850)
  const double beta = o.beta, eps = o.label_smoothing;
  const auto logits = logps.chosen - logps.rejected - o.simpo_gamma / beta;  // :709, :716-717
  const auto losses = -torch::log_sigmoid(logits * beta) * (1 - eps) -
                      torch::log_sigmoid(-logits * beta) * eps;  // :719-722
  // :842-845: the chosen rows' mean token cross-entropy, 0 when cpo_alpha is 0.
  const auto chosen = halves(p.logps);
  const auto nll = o.cpo_alpha == 0.0 ? torch::zeros({}, p.logps.options())
                                      : -chosen.chosen.sum() / halves(p.tokens).chosen.sum();
  PreferenceResult r;
  r.loss = losses.mean() + nll * o.cpo_alpha;  // :890
  auto& m = r.metrics;
  // :746-747: rewards β·(average logπ), detached.
  reward_metrics({logps.chosen.detach() * beta, logps.rejected.detach() * beta}, logps, m);
  if (p.logit_sum.defined()) {
    // :906-911: the mean of all_logits[:P] (every position, every vocabulary entry).
    const auto sums = halves(p.logit_sum + p.last_logit_sum);
    const auto means = logits_means(sums, p.logps.size(0) / 2, p.positions, p.vocab);
    m.logits_chosen = means.chosen;
    m.logits_rejected = means.rejected;
  }
  m.nll_loss = nll.detach();
  return r;
}

// Numerically stable log(1 - exp(x)) (orpo_trainer.py:87-91).
torch::Tensor log1mexp(const torch::Tensor& x) {
  constexpr double t = -0.6931471805599453;
  return torch::where(x < t, torch::log1p(-torch::exp(x)), torch::log(-torch::expm1(x)));
}

// ORPOTrainer (orpo_trainer.py:670-703, 745-877): NLL over the chosen rows' prompt and completion
// minus the mean of β·logσ(log odds ratio) of the length-averaged log-probabilities.
PreferenceResult orpo(const PreferenceInputs& in, const PreferenceOptions& o) {
  const auto& p = in.policy;
  const auto logps = average_logps(p);  // average_log_prob=True (:802-807)
  const auto log_odds = (logps.chosen - logps.rejected) -
                        (log1mexp(logps.chosen) - log1mexp(logps.rejected));  // :693-695
  const auto ratio = torch::log_sigmoid(log_odds);                            // :696
  const auto losses = ratio * o.beta;                                         // :697
  const auto full = halves(required(p.full_logps, "orpo needs full_labels in sequence_logps"));
  const auto nll =
      -full.chosen.sum() / halves(p.full_tokens).chosen.sum();  // :795-800: prompt and completion
  PreferenceResult r;
  r.loss = nll - losses.mean();  // :848
  auto& m = r.metrics;
  reward_metrics({logps.chosen.detach() * o.beta, logps.rejected.detach() * o.beta}, logps, m);
  if (p.logit_sum.defined()) {
    // :812-814, :860-865: the mean of all_logits[:P, :-1] (positions 0 .. T-2).
    const auto means =
        logits_means(halves(p.logit_sum), p.logps.size(0) / 2, p.positions - 1, p.vocab);
    m.logits_chosen = means.chosen;
    m.logits_rejected = means.rejected;
  }
  m.nll_loss = nll.detach();
  m.log_odds_ratio = ratio.detach().mean();
  m.log_odds_chosen = log_odds.detach().mean();
  return r;
}

}  // namespace

PreferenceLoss parse_preference_loss(const std::string& name) {
  for (auto t : {PreferenceLoss::sigmoid, PreferenceLoss::ipo, PreferenceLoss::hinge,
                 PreferenceLoss::robust, PreferenceLoss::simpo, PreferenceLoss::orpo}) {
    if (preference_loss_name(t) == name) return t;
  }
  throw std::invalid_argument("unknown preference loss type '" + name +
                              "'; known: sigmoid, ipo, hinge, robust, simpo, orpo");
}

std::string preference_loss_name(PreferenceLoss type) {
  switch (type) {
    case PreferenceLoss::sigmoid:
      return "sigmoid";
    case PreferenceLoss::ipo:
      return "ipo";
    case PreferenceLoss::hinge:
      return "hinge";
    case PreferenceLoss::robust:
      return "robust";
    case PreferenceLoss::simpo:
      return "simpo";
    case PreferenceLoss::orpo:
      return "orpo";
  }
  return "?";
}

void check_preference_options(const PreferenceOptions& o) {
  const auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
  if (o.types.empty()) fail("loss_type: give at least one loss type (e.g. sigmoid)");
  if (!o.weights.empty() && o.weights.size() != o.types.size()) {
    fail("loss_weights: " + std::to_string(o.weights.size()) + " weights for " +
         std::to_string(o.types.size()) + " loss types; give one weight per type");
  }
  for (auto t : o.types) {
    if ((t == PreferenceLoss::simpo || t == PreferenceLoss::orpo) && o.types.size() > 1) {
      fail("loss_type: " + preference_loss_name(t) +
           " stands alone; combine only sigmoid, ipo, hinge and robust");
    }
    const bool robust = t == PreferenceLoss::robust;
    if (robust && !(o.label_smoothing >= 0.0 && o.label_smoothing < 0.5)) {
      fail("label_smoothing: " + std::to_string(o.label_smoothing) +
           " for the robust loss; give a value in [0, 0.5)");
    }
  }
  if (!(o.beta > 0.0) || !std::isfinite(o.beta)) {
    fail("beta: " + std::to_string(o.beta) + "; give a positive number (TRL's default 0.1)");
  }
}

PreferenceResult preference_loss(const PreferenceInputs& inputs, const PreferenceOptions& options) {
  check_preference_options(options);
  if (!inputs.policy.logps.defined() || inputs.policy.logps.size(0) % 2 != 0) {
    throw std::invalid_argument(
        "preference_loss: the policy's logps must be [2P]: chosen, rejected");
  }
  switch (options.types.front()) {
    case PreferenceLoss::simpo:
      return simpo(inputs, options);
    case PreferenceLoss::orpo:
      return orpo(inputs, options);
    default:
      return dpo(inputs, options);
  }
}

std::vector<PreferenceMetrics::Weighted> PreferenceMetrics::weighted() const {
  // The DPO types' token-weighted metrics; the reference-free types' logits/* are means of one
  // value a rank (cpo_trainer.py:906-911, orpo_trainer.py:861-866).
  const bool tokens_weigh = tokens.defined();
  const std::tuple<const char*, const torch::Tensor*, const torch::Tensor*> all[] = {
      {"rewards/chosen", &rewards_chosen, &pairs},
      {"rewards/rejected", &rewards_rejected, &pairs},
      {"rewards/accuracies", &rewards_accuracies, &pairs},
      {"rewards/margins", &rewards_margins, &pairs},
      {"logps/chosen", &logps_chosen, &pairs},
      {"logps/rejected", &logps_rejected, &pairs},
      {"logits/chosen", &logits_chosen, tokens_weigh ? &chosen_tokens : nullptr},
      {"logits/rejected", &logits_rejected, tokens_weigh ? &rejected_tokens : nullptr},
      {"entropy", &entropy, &tokens},
      {"mean_token_accuracy", &mean_token_accuracy, &chosen_tokens},
      {"nll_loss", &nll_loss, nullptr},
      {"log_odds_ratio", &log_odds_ratio, nullptr},
      {"log_odds_chosen", &log_odds_chosen, nullptr}};
  std::vector<Weighted> out;
  for (const auto& [name, t, weight] : all) {
    if (!t->defined()) continue;
    out.push_back({name, *t,
                   weight && weight->defined()
                       ? *weight
                       : torch::ones({}, t->options().dtype(torch::kFloat))});
  }
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> PreferenceMetrics::named() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& w : weighted()) out.emplace_back(std::move(w.name), std::move(w.value));
  return out;
}

}  // namespace trainer::losses
