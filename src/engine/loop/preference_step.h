// Preference tuning's step (train.objective: dpo): each micro-batch of P pairs, 2P rows [chosen;
// rejected] of data.name: preference (data/tokens/preference.h), scored by the reference (the base
// with the LoRA adapters off, nn::AdaptersOff, or without LoRA a frozen copy of the starting
// weights; no gradient) and by the policy, then the `dpo:` section's loss of them
// (losses/preference.h), as TRL 1.16's DPOTrainer computes them (with PEFT, or a ref_model).
// The metrics TRL logs are summed on the device over a log window and read once per log record.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "distributed/process_group.h"
#include "engine/setup/objective.h"
#include "losses/preference.h"
#include "models/model.h"

namespace trainer::engine {

// train.objective's Objective: null for supervised (train.loss), the preference step for dpo.
// With `group` (ddp's ranks, more than one) each micro-batch's metrics are combined over the ranks
// as TRL's gather_for_metrics combines them (one all-reduce of a few values). The preference step
// is also a SavedPart ("dpo.": the metrics window), which the checkpoints hold. Without
// model.lora, a loss type that compares with a reference takes a frozen copy of `model`'s
// parameters as they are now (made before a resume's checkpoint replaces them: the base weights),
// TRL's ref_model of a full fine-tune; its memory is a second copy of the weights.
std::shared_ptr<Objective> make_objective(const config::Config& cfg,
                                          distributed::Group* group = nullptr,
                                          models::NetImpl* model = nullptr);

// The `dpo:` section as the losses take it.
losses::PreferenceOptions preference_options(const config::DpoConfig& dpo);

// Labels [B, T] as TRL takes them (the token at each position, -100 outside the completions) from
// next-token targets [B, T] (targets[t] the label of position t + 1, the last column -100).
torch::Tensor labels_from_targets(const torch::Tensor& targets);

}  // namespace trainer::engine
