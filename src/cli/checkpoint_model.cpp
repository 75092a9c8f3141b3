#include "cli/checkpoint_model.h"

#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "util/log.h"

namespace trainer::cli {

namespace fs = std::filesystem;

std::string checkpoint_file(const std::string& spec, std::optional<checkpoint::State>* state) {
  std::error_code ec;
  if (fs::is_regular_file(spec, ec)) return spec;
  if (!fs::is_directory(spec, ec)) {
    throw UsageError("--checkpoint: " + spec + " is neither a checkpoint file nor a run dir");
  }
  const checkpoint::Directory dir((fs::path(spec) / "checkpoints").string(), 1, "");
  // A training that keeps few checkpoints may remove the newest between the manifest's read and
  // the file's: the manifest is read again, a few times.
  std::optional<std::pair<std::string, checkpoint::State>> latest;
  for (int attempt = 0;; ++attempt) {
    try {
      latest = dir.load_latest();
      break;
    } catch (const checkpoint::CorruptCheckpoint&) {
      if (attempt == 2) throw;
    }
  }
  if (!latest) throw UsageError("--checkpoint: " + spec + " holds no checkpoint (checkpoints/)");
  if (state) *state = std::move(latest->second);
  return latest->first;
}

namespace {

// The checkpoint of --checkpoint `spec` (a run dir: its newest that verifies, read once, so that a
// training pruning its checkpoints meanwhile cannot take it away) and the config to rebuild its
// model from: `config` (--config), else the run dir's config.yaml.
struct Resolved {
  std::string checkpoint, config;
  std::optional<checkpoint::State> state;  // read already (a run dir)
};

Resolved checkpoint_and_config(const std::string& spec, const std::string& config) {
  std::error_code ec;
  Resolved r;
  r.checkpoint = checkpoint_file(spec, &r.state);
  r.config = config;
  // A run dir, or <run dir>/checkpoints/step_N.safetensors.
  const fs::path run_dir = fs::is_directory(spec, ec)
                               ? fs::path(spec)
                               : fs::absolute(spec, ec).parent_path().parent_path();
  if (!config.empty()) return r;
  const fs::path saved = run_dir / "config.yaml";
  if (!fs::is_regular_file(saved, ec)) {
    throw UsageError("--checkpoint: no config.yaml in " + run_dir.string() +
                     " (the run dir a checkpoints/ file belongs to) to rebuild the model and data "
                     "from; give --config FILE");
  }
  r.config = saved.string();
  return r;
}

// `loaded` for using a model, not training it: the whole model on every rank, whatever the
// training strategy was (a sharded checkpoint loads whole), and no weight average or spike guard
// beside it.
void for_use(config::LoadedConfig& loaded) {
  loaded.cfg.dist.strategy = "ddp";
  loaded.cfg.train.ema = {};
  loaded.cfg.train.skip_update_zscore = {};
}

// The model of --config alone: its model.pretrained weights (loaded as training starts from them),
// at step 0.
CheckpointModel pretrained_model(const cxxopts::ParseResult& args, const distributed::DistEnv& job,
                                 const std::string& command) {
  CheckpointModel m{"",
                    load_config(args["config"].as<std::string>(), set_and_device(args),
                                engine::config_environment()),
                    nullptr, 0, "pretrained"};
  m.checkpoint = m.loaded.cfg.model.pretrained;
  if (m.checkpoint.empty()) {
    throw UsageError(command + ": --config " + args["config"].as<std::string>() +
                     " without --checkpoint needs model.pretrained (the weights to use); give "
                     "--checkpoint PATH|RUN_DIR or --set model.pretrained=FILE");
  }
  for_use(m.loaded);
  m.trainer = std::make_unique<engine::Trainer>(m.loaded, job);
  log::info("weights: pretrained, model.pretrained's " + m.checkpoint);
  return m;
}

}  // namespace

void add_checkpoint_options(cxxopts::Options& options) {
  // clang-format off
  options.add_options()
      ("checkpoint", "a checkpoint file, or a run dir (its newest checkpoint that verifies)",
       cxxopts::value<std::string>(), "PATH|RUN_DIR")
      ("config", "the config to rebuild model and data from (default: the run dir's config.yaml); "
       "without --checkpoint, the config's model.pretrained weights are used",
       cxxopts::value<std::string>(), "FILE")
      ("set", "override a config key (repeatable)", cxxopts::value<std::vector<std::string>>(),
       "KEY.PATH=VALUE")
      ("device", "cpu, cuda, cuda:N (same as --set device=...)", cxxopts::value<std::string>(), "D")
      ("weights", "ema: the checkpoint's average of the weights (train.ema), the default where it "
       "holds one; raw: the trained weights", cxxopts::value<std::string>(), "ema|raw")
      ("log-level", "trace|debug|info|warn|error",
       cxxopts::value<std::string>()->default_value("warn"), "L");
  // clang-format on
}

engine::WeightsUse weights_use(const cxxopts::ParseResult& args) {
  if (!args.count("weights")) return engine::WeightsUse::average_if_saved;
  const std::string w = args["weights"].as<std::string>();
  if (w == "ema") return engine::WeightsUse::average;
  if (w == "raw") return engine::WeightsUse::trained;
  throw UsageError("--weights: expected ema or raw, got '" + w + "'");
}

CheckpointModel load_checkpoint_model(const cxxopts::ParseResult& args,
                                      const distributed::DistEnv& job, const std::string& command,
                                      engine::LabelUse labels) {
  if (!args.count("checkpoint") && !args.count("config")) {
    throw UsageError(command +
                     ": --checkpoint PATH|RUN_DIR is required (or --config FILE whose "
                     "model.pretrained holds the weights)");
  }
  setup_logging(args["log-level"].as<std::string>(), job);
  if (!args.count("checkpoint")) return pretrained_model(args, job, command);
  auto resolved =
      checkpoint_and_config(args["checkpoint"].as<std::string>(),
                            args.count("config") ? args["config"].as<std::string>() : "");
  CheckpointModel m{
      resolved.checkpoint,
      load_config(resolved.config, set_and_device(args), engine::config_environment()), nullptr, 0,
      ""};
  for_use(m.loaded);
  m.trainer = std::make_unique<engine::Trainer>(m.loaded, job);
  m.step = m.trainer->load_model(m.checkpoint, labels, resolved.state ? &*resolved.state : nullptr,
                                 weights_use(args));
  m.weights = m.trainer->loaded_average() ? "ema" : "raw";
  log::info(m.weights == "ema"
                ? "weights: ema, the checkpoint's average of the weights (train.ema); --weights "
                  "raw uses the trained ones"
                : "weights: raw, the trained weights of the checkpoint");
  return m;
}

}  // namespace trainer::cli
