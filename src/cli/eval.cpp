// trainer eval: scores a checkpoint on its data set's validation split.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "distributed/env.h"
#include "engine/trainer.h"
#include "util/format.h"

namespace trainer::cli {
namespace {

nlohmann::json result_json(const engine::EvalResult& e, const std::string& checkpoint,
                           int64_t step, const std::string& split) {
  nlohmann::json j = {{"checkpoint", checkpoint},
                      {"step", step},
                      {"split", split},
                      {"samples", e.samples},
                      {"loss", e.loss}};
  if (e.sequence) {
    j["ppl"] = e.ppl;
  } else {
    j["top1"] = e.top1;
    j["top5"] = e.top5;
  }
  return j;
}

}  // namespace

int eval_command(int argc, char** argv) {
  cxxopts::Options options(
      "trainer eval", "Scores a checkpoint on a split of its data set (validation by default).");
  // clang-format off
  options.add_options()
      ("checkpoint", "a checkpoint file, or a run dir (its newest checkpoint that verifies)",
       cxxopts::value<std::string>(), "PATH|RUN_DIR")
      ("config", "the config to rebuild model and data from (default: the run dir's config.yaml)",
       cxxopts::value<std::string>(), "FILE")
      ("set", "override a config key, e.g. --set data.eval_batch_size=256 (repeatable)",
       cxxopts::value<std::vector<std::string>>(), "KEY.PATH=VALUE")
      ("device", "cpu, cuda, cuda:N (same as --set device=...)", cxxopts::value<std::string>(), "D")
      ("split", "val, or train (its samples as training draws them, each once)",
       cxxopts::value<std::string>()->default_value("val"), "val|train")
      ("json", "print one JSON object instead of the line")
      ("log-level", "trace|debug|info|warn|error",
       cxxopts::value<std::string>()->default_value("warn"), "L")
      ("h,help", "print this help");
  // clang-format on
  const cxxopts::ParseResult args = parse_or_usage(options, argc, argv);
  if (args.count("help")) {
    std::cout << options.help()
              << "\nRuns in a launched job too (trainer launch ... -- eval ...): each validation "
                 "sample is scored once over the ranks; rank 0 prints.\n";
    return 0;
  }
  if (!args.count("checkpoint")) throw UsageError("eval: --checkpoint PATH|RUN_DIR is required");
  const distributed::DistEnv job = distributed::read_process_env();
  setup_logging(args["log-level"].as<std::string>(), job);
  const auto [checkpoint, config] =
      checkpoint_and_config(args["checkpoint"].as<std::string>(),
                            args.count("config") ? args["config"].as<std::string>() : "");
  const auto loaded = load_config(config, set_and_device(args), engine::config_environment());
  engine::Trainer trainer(loaded, job);
  const int64_t step = trainer.load_model(checkpoint);
  const std::string split = args["split"].as<std::string>();
  if (split != "val" && split != "train") {
    throw UsageError("--split: expected val or train, got '" + split + "'");
  }
  const engine::EvalResult e = split == "val" ? trainer.evaluate() : trainer.evaluate_train_split();
  if (job.rank != 0) return 0;
  if (args.count("json")) {
    std::cout << result_json(e, checkpoint, step, split).dump() << "\n";
  } else if (e.sequence) {
    std::cout << strprintf("eval %s (step %" PRId64 ", %s): loss %.4f, ppl %.3f (%" PRId64
                           " tokens)\n",
                           checkpoint.c_str(), step, split.c_str(), e.loss, e.ppl, e.samples);
  } else {
    std::cout << strprintf("eval %s (step %" PRId64
                           ", %s): loss %.4f, top-1 %.2f%%, top-5 %.2f%% (%" PRId64 " samples)\n",
                           checkpoint.c_str(), step, split.c_str(), e.loss, 100 * e.top1,
                           100 * e.top5, e.samples);
  }
  return 0;
}

}  // namespace trainer::cli
