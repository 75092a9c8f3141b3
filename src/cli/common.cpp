// What the commands share: versions, logging set-up, reading a config.
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "engine/components.h"
#include "util/log.h"

namespace trainer::cli {

namespace fs = std::filesystem;

std::string cuda_build_version() {
  try {
    const long v = at::detail::getCUDAHooks().versionCUDART();  // e.g. 13000
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
  } catch (const std::exception&) {
    return "cpu";
  }
}

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

std::vector<std::string> set_and_device(const cxxopts::ParseResult& args) {
  std::vector<std::string> overrides;
  if (args.count("set")) overrides = args["set"].as<std::vector<std::string>>();
  if (args.count("device")) overrides.push_back("device=" + args["device"].as<std::string>());
  return overrides;
}

void setup_logging(const std::string& level_text, const distributed::DistEnv& job) {
  log::Level level;
  if (!log::parse_level(level_text, &level)) {
    throw UsageError("--log-level: unknown level '" + level_text +
                     "'; use trace, debug, info, warn or error");
  }
  if (job.rank > 0 && level < log::Level::warn) level = log::Level::warn;
  log::setup(level, job.rank);
}

std::string version_text() {
  return std::string("trainer ") + TRAINER_VERSION + "\nLibTorch " + TORCH_VERSION + "\nCUDA " +
         cuda_build_version() + "\n";
}

config::LoadedConfig load_config(const std::string& path, const std::vector<std::string>& overrides,
                                 const config::Environment& env) {
  auto loaded = engine::load_config(path, overrides);
  config::check(loaded, env);
  return loaded;
}

}  // namespace trainer::cli
