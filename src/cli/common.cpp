// What the commands share: versions, logging set-up, reading a config.
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "engine/setup/components.h"
#include "util/log.h"

namespace trainer::cli {

std::string cuda_build_version() {
  try {
    const long v = at::detail::getCUDAHooks().versionCUDART();  // e.g. 13000
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
  } catch (const std::exception&) {
    return "cpu";
  }
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
