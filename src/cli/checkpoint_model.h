// What eval, predict and generate start from: a checkpoint's model, rebuilt from its config.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "cli/options.h"
#include "config/loader.h"
#include "distributed/env.h"
#include "engine/loop/trainer.h"

namespace trainer::cli {

// The checkpoint file of --checkpoint `spec`: the file itself, or a run dir's newest checkpoint
// that verifies (its state, read already, in `state` when given). Throws UsageError for anything
// else and for a run dir without checkpoints.
std::string checkpoint_file(const std::string& spec,
                            std::optional<checkpoint::State>* state = nullptr);

// Adds --checkpoint, --config, --set, --device, --weights and --log-level to `options`.
void add_checkpoint_options(cxxopts::Options& options);

// --weights: ema, raw, or (absent) the average where the checkpoint holds one. Throws
// UsageError for anything else.
engine::WeightsUse weights_use(const cxxopts::ParseResult& args);

struct CheckpointModel {
  std::string checkpoint;  // the checkpoint file
  // The config as the run names it: its model.pretrained (the folder of the tokenizer and the
  // generation settings, whether or not the weights are read from it) and its data.
  config::LoadedConfig loaded;
  std::unique_ptr<engine::Trainer> trainer;  // holding the checkpoint's model weights
  int64_t step = 0;                          // the step the checkpoint was written at
  // Which weights the model holds: "ema" (the checkpoint's train.ema average), "raw" (the
  // trained ones) or "pretrained" (--config's model.pretrained).
  std::string weights;
};

// Sets up logging (--log-level) and loads the model of --checkpoint PATH|RUN_DIR (a run dir:
// its newest checkpoint that verifies) into a Trainer built from the run dir's config.yaml, or
// --config, with --set and --device; `labels` says whether the data's labels are used (eval), so
// that they must mean the checkpoint's classes. Without --checkpoint: the model of --config with
// its model.pretrained weights, at step 0. Logs which weights it holds (CheckpointModel::weights).
//
// A checkpoint of a whole model (every weight, no LoRA) is used as it is: its model is the one its
// config records (the model.* keys the config leaves at their defaults taken from it) and
// model.pretrained's weights and config.json are not read, so that the folder may have moved;
// the folder then only gives chat data its default tokenizer (as data.tokenizer). A LoRA
// checkpoint's base is read from model.pretrained, any copy of it (checked by its contents):
// config::ConfigError naming model.pretrained when nothing is there. Without `needs_data` (a
// language model's vocabulary known from model.vocab_size or the checkpoint's embedding) the
// Trainer is built without the run's data (one synthetic sample): its files are not read.
//
// Throws UsageError, naming `command`, when neither is given, when --config alone sets no
// model.pretrained, or when --checkpoint names neither a checkpoint nor a run dir with a config.
// Every rank of `job` must call it.
CheckpointModel load_checkpoint_model(const cxxopts::ParseResult& args,
                                      const distributed::DistEnv& job, const std::string& command,
                                      engine::LabelUse labels = engine::LabelUse::none,
                                      bool needs_data = true);

}  // namespace trainer::cli
