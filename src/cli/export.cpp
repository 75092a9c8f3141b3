// trainer export: writes a checkpoint's model weights as safetensors.
#include <filesystem>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "engine/checkpointer.h"
#include "util/fileio.h"
#include "util/log.h"

namespace trainer::cli {

namespace fs = std::filesystem;

// trainer export: the model weights of a checkpoint as a plain safetensors file with PyTorch
// state-dict names (torchvision's for the ResNets, nanoGPT's for gpt).
int export_command(int argc, char** argv) {
  cxxopts::Options options("trainer export",
                           "Writes the model weights of a checkpoint as safetensors.");
  // clang-format off
  options.add_options()
      ("checkpoint", "a checkpoint file (<run.dir>/checkpoints/step_*.safetensors)",
       cxxopts::value<std::string>(), "PATH")
      ("out", "the safetensors file to write", cxxopts::value<std::string>(), "FILE")
      ("h,help", "print this help");
  // clang-format on
  const cxxopts::ParseResult args = parse_or_usage(options, argc, argv);
  if (args.count("help")) {
    std::cout << options.help();
    return 0;
  }
  if (!args.count("checkpoint") || !args.count("out")) {
    throw UsageError("export needs --checkpoint PATH and --out FILE");
  }
  log::setup(log::Level::info, /*rank=*/0);
  const auto path = args["checkpoint"].as<std::string>();
  const auto out = args["out"].as<std::string>();
  if (!fs::is_regular_file(path)) throw UsageError("--checkpoint: " + path + " is not a file");
  std::error_code ec;
  if (fs::equivalent(path, out, ec)) {
    throw UsageError("--out " + out +
                     " is the checkpoint itself; writing the weights there would "
                     "replace the training checkpoint; choose another --out");
  }
  const auto state = checkpoint::load(path);
  const auto weights = engine::model_weights(state);
  const auto& config = state.meta.contains("config") ? state.meta["config"] : nlohmann::json();
  const auto& step = state.meta.contains("step") ? state.meta["step"] : nlohmann::json();
  if (!config.is_object() || !config.contains("model.name") || !config["model.name"].is_string() ||
      !step.is_number_integer() || weights.empty()) {
    throw checkpoint::CorruptCheckpoint(
        path +
        ": not a checkpoint of this trainer (its metadata lacks the config's model.name "
        "or the step, or it holds no model.* tensor)");
  }
  const std::string model = config["model.name"].get<std::string>();
  write_atomically(out, [&](const ByteSink& sink) {
    checkpoint::write_safetensors(
        weights, {{"format", "pt"}, {"model", model}, {"step", step.dump()}}, sink);
  });
  std::cout << "wrote " << out << ": " << weights.size() << " tensors of " << model << " at step "
            << step.dump() << "\n";
  return 0;
}

}  // namespace trainer::cli
