// Preference losses over pairs of completions (DPO and its family: IPO, hinge, robust; the
// reference-free SimPO and ORPO) and the per-sequence log-probabilities they take, computed as TRL
// 1.16 computes them (trl/trainer/dpo_trainer.py, trl/experimental/cpo/cpo_trainer.py,
// trl/experimental/orpo/orpo_trainer.py), with the metrics TRL logs under its names.
//
// A batch of P pairs is 2P rows: the P chosen completions, then the P rejected ones, each row a
// prompt followed by its completion (right-padded). Labels are the input ids with kIgnoreIndex
// (-100) wherever the token is not a completion token (the prompt, the padding).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trainer::losses {

// Per-row log-probabilities of a batch of sequences and the statistics TRL's metrics take.
// Every tensor is [B] (B rows), float32 unless said; only logps and full_logps carry gradients.
struct SequenceLogps {
  // Σ log softmax(logits[t])[labels[t + 1]] over the positions t whose next label is kept: the
  // logits at position t predict the token at t + 1 (TRL's shift).
  torch::Tensor logps;
  // The tokens summed in logps: labels[:, 1:] != -100 (the average log-probability's divisor).
  torch::Tensor tokens;
  // labels != -100 over the whole row: TRL's completion_mask.sum(1), IPO's length (it differs from
  // tokens when the first token of a row is labelled).
  torch::Tensor labelled;
  // The same sums over full_labels (ORPO's NLL over prompt and completion); undefined without them.
  torch::Tensor full_logps;
  torch::Tensor full_tokens;
  // Detached, with SequenceLogpsOptions::stats (undefined without):
  torch::Tensor mean_logit_sum;  // Σ over the tokens of logps of the mean logit over the vocabulary
  torch::Tensor entropy_sum;     // Σ over the same tokens of the predicted distribution's entropy
  torch::Tensor top1;            // the same tokens whose label is the first most likely token
  torch::Tensor logit_sum;       // Σ of every logit at positions 0 .. T-2 (float64)
  torch::Tensor last_logit_sum;  // Σ of every logit at position T-1 (float64)
  int64_t positions = 0;         // T
  int64_t vocab = 0;             // V
};

struct SequenceLogpsOptions {
  bool stats = true;       // compute the detached statistics (off for a reference model's pass)
  int64_t block_rows = 0;  // positions per block of logits (0: about 4M logits per block)
};

// Logits [B, T, V] (float32, bfloat16 or float16; computed in float32), labels [B, T] int64 with
// -100 where ignored and optionally full_labels [B, T] (another label set scored from the same
// logits) -> the sums above. Blocks of positions go through float32 one at a time: no [B, T, V]
// log-softmax is held; the backward keeps only the logits, the targets and one float32 [B * T] of
// log-sum-exps, and writes the logits' gradient in their dtype. No host read.
SequenceLogps sequence_logps(const torch::Tensor& logits, const torch::Tensor& labels,
                             const torch::Tensor& full_labels = {},
                             const SequenceLogpsOptions& options = {});

// The same from hidden [B, T, C] and the output layer's weight [V, C], logits = hidden · weightᵀ
// (nn::aligned_linear's product, in autocast's dtype when autocast is on, as the model's head
// computes it): the logits are made options.block_rows positions at a time (0: chunks of about 4M
// logits, at most 8 of them) and never held whole; backward recomputes each chunk's logits. TRL's
// fused LM head (trl/trainer/utils.py, add_fused_lm_head) works the same way. No host read.
SequenceLogps sequence_logps_linear(const torch::Tensor& hidden, const torch::Tensor& weight,
                                    const torch::Tensor& labels,
                                    const torch::Tensor& full_labels = {},
                                    const SequenceLogpsOptions& options = {});

// TRL's loss types. The DPO ones (sigmoid, ipo, hinge, robust) compare the policy with a reference
// and may be combined with weights; simpo (CPOTrainer, loss_type "simpo") and orpo (ORPOTrainer)
// are reference-free and stand alone.
enum class PreferenceLoss { sigmoid, ipo, hinge, robust, simpo, orpo };

// "sigmoid" -> PreferenceLoss::sigmoid; throws std::invalid_argument naming the known ones.
PreferenceLoss parse_preference_loss(const std::string& name);
std::string preference_loss_name(PreferenceLoss type);

struct PreferenceOptions {
  std::vector<PreferenceLoss> types = {PreferenceLoss::sigmoid};
  std::vector<double> weights;   // one per type (TRL's loss_weights); empty: 1 each
  double beta = 0.1;             // DPOConfig.beta, CPOConfig.beta, ORPOConfig.beta (ORPO's λ)
  double label_smoothing = 0.0;  // robust's ε in [0, 0.5); simpo's conservative smoothing
  double simpo_gamma = 0.5;      // CPOConfig.simpo_gamma
  double cpo_alpha = 0.0;        // simpo: weight of the NLL on chosen (CPOConfig's default is 1.0)
};

// Throws std::invalid_argument with one line naming the option and how to fix it.
void check_preference_options(const PreferenceOptions& options);

struct PreferenceInputs {
  SequenceLogps policy;     // [2P]: chosen rows, then rejected rows
  torch::Tensor reference;  // [2P] the reference's logps (DPO types); undefined for simpo, orpo
};

// Detached 0-dim float32 tensors, the batch's values as TRL logs them for one call; undefined
// where the loss type has none.
struct PreferenceMetrics {
  torch::Tensor rewards_chosen, rewards_rejected, rewards_accuracies, rewards_margins;
  torch::Tensor logps_chosen, logps_rejected, logits_chosen, logits_rejected;
  torch::Tensor entropy, mean_token_accuracy;     // DPO types
  torch::Tensor nll_loss;                         // simpo, orpo
  torch::Tensor log_odds_ratio, log_odds_chosen;  // orpo

  // What the values are means over, where TRL's gather_for_metrics combines the ranks' batches
  // into one: the pairs (rewards/*, logps/*: means over the global batch), the completion tokens
  // of the chosen rows, of the rejected rows and of both (the DPO types' logits/chosen and
  // mean_token_accuracy, logits/rejected, entropy: sums over sums). Float32 0-dim. The other
  // values (simpo's and orpo's logits/*, nll_loss, log_odds_*) are TRL's means of one value a rank.
  torch::Tensor pairs, chosen_tokens, rejected_tokens, tokens;

  // (TRL's name, value) of the defined ones: "rewards/chosen", "logits/rejected", "nll_loss", ...
  std::vector<std::pair<std::string, torch::Tensor>> named() const;

  // (name, value, weight) of the defined ones, in named()'s order: over several batches, TRL's
  // value is Σ value·weight / Σ weight (0 where Σ weight is 0); weight a float32 0-dim tensor (1
  // for the means of one value a rank).
  struct Weighted {
    std::string name;
    torch::Tensor value, weight;
  };
  std::vector<Weighted> weighted() const;
};

struct PreferenceResult {
  torch::Tensor loss;  // 0-dim float32, differentiable through inputs.policy
  PreferenceMetrics metrics;
};

// The loss and metrics of one batch of pairs. No host read.
PreferenceResult preference_loss(const PreferenceInputs& inputs, const PreferenceOptions& options);

}  // namespace trainer::losses
