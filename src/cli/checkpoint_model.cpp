#include "cli/checkpoint_model.h"

#include <filesystem>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"

namespace trainer::cli {
namespace {

namespace fs = std::filesystem;

// The checkpoint file and the config of --checkpoint `spec`; `config` (--config) replaces the
// run dir's config.yaml.
std::pair<std::string, std::string> checkpoint_and_config(const std::string& spec,
                                                          const std::string& config) {
  std::error_code ec;
  std::string checkpoint = spec;
  fs::path run_dir;
  if (fs::is_directory(spec, ec)) {
    run_dir = spec;
    const checkpoint::Directory dir((run_dir / "checkpoints").string(), 1, "");
    const auto latest = dir.load_latest();
    if (!latest) throw UsageError("--checkpoint: " + spec + " holds no checkpoint (checkpoints/)");
    checkpoint = latest->first;
  } else if (fs::is_regular_file(spec, ec)) {
    run_dir = fs::path(spec).parent_path().parent_path();
  } else {
    throw UsageError("--checkpoint: " + spec + " is neither a checkpoint file nor a run dir");
  }
  if (!config.empty()) return {checkpoint, config};
  const fs::path saved = run_dir / "config.yaml";
  if (!fs::is_regular_file(saved, ec)) {
    throw UsageError("--checkpoint: no config.yaml in " + run_dir.string() +
                     " to rebuild the model and data from; give --config FILE");
  }
  return {checkpoint, saved.string()};
}

}  // namespace

void add_checkpoint_options(cxxopts::Options& options) {
  // clang-format off
  options.add_options()
      ("checkpoint", "a checkpoint file, or a run dir (its newest checkpoint that verifies)",
       cxxopts::value<std::string>(), "PATH|RUN_DIR")
      ("config", "the config to rebuild model and data from (default: the run dir's config.yaml)",
       cxxopts::value<std::string>(), "FILE")
      ("set", "override a config key (repeatable)", cxxopts::value<std::vector<std::string>>(),
       "KEY.PATH=VALUE")
      ("device", "cpu, cuda, cuda:N (same as --set device=...)", cxxopts::value<std::string>(), "D")
      ("log-level", "trace|debug|info|warn|error",
       cxxopts::value<std::string>()->default_value("warn"), "L");
  // clang-format on
}

CheckpointModel load_checkpoint_model(const cxxopts::ParseResult& args,
                                      const distributed::DistEnv& job, const std::string& command,
                                      engine::LabelUse labels) {
  if (!args.count("checkpoint"))
    throw UsageError(command + ": --checkpoint PATH|RUN_DIR is required");
  setup_logging(args["log-level"].as<std::string>(), job);
  auto [checkpoint, config] =
      checkpoint_and_config(args["checkpoint"].as<std::string>(),
                            args.count("config") ? args["config"].as<std::string>() : "");
  CheckpointModel m{std::move(checkpoint),
                    load_config(config, set_and_device(args), engine::config_environment())};
  // A sharded checkpoint loads whole: every rank uses the whole model, whatever the training
  // strategy was.
  m.loaded.cfg.dist.strategy = "ddp";
  m.trainer = std::make_unique<engine::Trainer>(m.loaded, job);
  m.step = m.trainer->load_model(m.checkpoint, labels);
  return m;
}

}  // namespace trainer::cli
