// trainer eval: scores a checkpoint on its data set's validation split.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "cli/checkpoint_model.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "distributed/env.h"
#include "engine/loop/trainer.h"
#include "util/format.h"

namespace trainer::cli {
namespace {

nlohmann::json result_json(const engine::EvalResult& e, const std::string& checkpoint, int64_t step,
                           const std::string& split, const std::string& weights) {
  nlohmann::json j = {{"checkpoint", checkpoint},
                      {"step", step},
                      {"weights", weights},
                      {"split", split},
                      {"samples", e.samples},
                      {"loss", e.loss}};
  if (!e.objective.empty()) {  // train.objective's metrics (dpo: TRL's names)
    for (const auto& [name, value] : e.objective) j[name] = value;
  } else if (e.sequence) {
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
  add_checkpoint_options(options);
  options.add_options()
      ("split", "val, or train (its samples as training draws them, each once)",
       cxxopts::value<std::string>()->default_value("val"), "val|train")
      ("json", "print one JSON object instead of the line")
      ("h,help", "print this help");
  // clang-format on
  const cxxopts::ParseResult args = parse_or_usage(options, argc, argv);
  if (args.count("help")) {
    std::cout << options.help()
              << "\nRuns in a launched job too (trainer launch ... -- eval ...): each validation "
                 "sample is scored once over the ranks; rank 0 prints.\n";
    return 0;
  }
  const distributed::DistEnv job = distributed::read_process_env();
  const auto m = load_checkpoint_model(args, job, "eval", engine::LabelUse::train_and_score);
  auto& trainer = *m.trainer;
  const std::string& checkpoint = m.checkpoint;
  const int64_t step = m.step;
  const std::string split = args["split"].as<std::string>();
  if (split != "val" && split != "train") {
    throw UsageError("--split: expected val or train, got '" + split + "'");
  }
  const engine::EvalResult e = split == "val" ? trainer.evaluate() : trainer.evaluate_train_split();
  if (job.rank != 0) return 0;
  if (args.count("json")) {
    std::cout << result_json(e, checkpoint, step, split, m.weights).dump() << "\n";
  } else if (!e.objective.empty()) {
    std::string metrics;
    for (const auto& [name, value] : e.objective) {
      metrics += strprintf(", %s %.6g", name.c_str(), value);
    }
    std::cout << strprintf("eval %s (step %" PRId64 ", %s, %s weights): loss %.4f%s (%" PRId64
                           " pairs)\n",
                           checkpoint.c_str(), step, split.c_str(), m.weights.c_str(), e.loss,
                           metrics.c_str(), e.samples);
  } else if (e.sequence) {
    std::cout << strprintf("eval %s (step %" PRId64 ", %s, %s weights): loss %.4f, ppl %.3f (%" PRId64
                           " tokens)\n",
                           checkpoint.c_str(), step, split.c_str(), m.weights.c_str(), e.loss,
                           e.ppl, e.samples);
  } else {
    std::cout << strprintf("eval %s (step %" PRId64
                           ", %s, %s weights): loss %.4f, top-1 %.2f%%, top-5 %.2f%% (%" PRId64
                           " samples)\n",
                           checkpoint.c_str(), step, split.c_str(), m.weights.c_str(), e.loss,
                           100 * e.top1, 100 * e.top5, e.samples);
  }
  return 0;
}

}  // namespace trainer::cli
