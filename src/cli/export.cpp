// trainer export: writes a checkpoint's model weights as safetensors.
#include <filesystem>
#include <iostream>
#include <map>

#include "checkpoint/checkpoint.h"
#include "cli/checkpoint_model.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "engine/loop/checkpointer.h"
#include "engine/loop/weight_average.h"
#include "models/model.h"
#include "util/fileio.h"
#include "util/log.h"

namespace trainer::cli {

namespace fs = std::filesystem;

namespace {

// --format hf: the model's Hugging Face layout, as `save_pretrained` writes it, into folder
// `out`.
int export_hf(const std::string& path, const std::string& out, const std::string& model,
              const checkpoint::NamedTensors& weights, const nlohmann::json& config) {
  const auto& hf = models::model_registry().get(model).hf;
  if (!hf) {
    throw UsageError("--format hf: " + path + " holds a " + model +
                     ", which has no Hugging Face layout here (gpt has: GPT-2)");
  }
  std::map<std::string, std::string> flat;
  for (const auto& [key, value] : config.items()) {
    if (value.is_string()) flat[key] = value.get<std::string>();
  }
  const auto [tensors, hf_config] = hf->from_trainer(weights, flat);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw UsageError("--out " + out + ": cannot create the folder: " + ec.message());
  write_atomically((fs::path(out) / "model.safetensors").string(), [&](const ByteSink& sink) {
    checkpoint::write_safetensors(tensors, {{"format", "pt"}}, sink);
  });
  write_text_atomically((fs::path(out) / "config.json").string(), hf_config.dump(2) + "\n");
  std::cout << "wrote " << out << ": " << hf->name << ", " << tensors.size()
            << " tensors and config.json\n";
  return 0;
}

// The pt export's metadata: format, model, step, the class names and the classifier's outputs.
std::map<std::string, std::string> pt_metadata(const checkpoint::State& state,
                                               const std::string& model,
                                               const nlohmann::json& step) {
  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"model", model}, {"step", step.dump()}};
  if (state.meta.contains("classes") && !state.meta["classes"].empty()) {
    metadata["classes"] = state.meta["classes"].dump();  // JSON list of the class names
  }
  // The classifier's outputs, as the checkpoint records them; older checkpoints: the names' count.
  if (state.meta.contains("num_classes") && state.meta["num_classes"].is_number_integer()) {
    metadata["num_classes"] = state.meta["num_classes"].dump();
  } else if (metadata.count("classes")) {
    metadata["num_classes"] = std::to_string(state.meta["classes"].size());
  }
  return metadata;
}

// --weights: the checkpoint's average (train.ema) where `use` asks for it and it holds one (then
// `averaged` is set), else its trained weights; UsageError for ema without an average.
checkpoint::NamedTensors chosen_weights(const checkpoint::State& state, engine::WeightsUse use,
                                        const std::string& path, bool& averaged) {
  if (use != engine::WeightsUse::trained) {
    auto average = engine::averaged_weights(state);
    averaged = !average.empty();
    if (averaged) return average;
  }
  if (use == engine::WeightsUse::average) {
    throw UsageError("--weights ema: " + path +
                     " holds no average of the weights (it was trained without train.ema); use "
                     "--weights raw");
  }
  return engine::model_weights(state);
}

}  // namespace

// trainer export: the model weights of a checkpoint as a plain safetensors file with PyTorch
// state-dict names (torchvision's for the ResNets, nanoGPT's for gpt).
int export_command(int argc, char** argv) {
  cxxopts::Options options("trainer export",
                           "Writes the model weights of a checkpoint as safetensors.");
  // clang-format off
  options.add_options()
      ("checkpoint", "a checkpoint file (<run.dir>/checkpoints/step_*.safetensors), or a run dir "
       "(its newest checkpoint that verifies)",
       cxxopts::value<std::string>(), "PATH")
      ("out", "the safetensors file to write (--format hf: the folder)",
       cxxopts::value<std::string>(), "FILE|DIR")
      ("weights", "ema: the checkpoint's average of the weights (train.ema), the default where it "
       "holds one; raw: the trained weights", cxxopts::value<std::string>(), "ema|raw")
      ("format", "pt: PyTorch state-dict names; hf: a Hugging Face folder (model.safetensors, "
       "config.json) that transformers' from_pretrained loads (gpt: GPT2LMHeadModel)",
       cxxopts::value<std::string>()->default_value("pt"), "pt|hf")
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
  const std::string path = checkpoint_file(args["checkpoint"].as<std::string>());
  const auto out = args["out"].as<std::string>();
  std::error_code ec;
  if (fs::equivalent(path, out, ec)) {
    throw UsageError("--out " + out +
                     " is the checkpoint itself; writing the weights there would "
                     "replace the training checkpoint; choose another --out");
  }
  const auto state = checkpoint::load(path);
  bool averaged = false;
  const auto weights = chosen_weights(state, weights_use(args), path, averaged);
  const char* which = averaged ? " (train.ema's average)" : "";
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
  const std::string format = args["format"].as<std::string>();
  if (format == "hf") return export_hf(path, out, model, weights, config);
  if (format != "pt") throw UsageError("--format: expected pt or hf, got '" + format + "'");
  const auto metadata = pt_metadata(state, model, step);
  write_atomically(
      out, [&](const ByteSink& sink) { checkpoint::write_safetensors(weights, metadata, sink); });
  std::cout << "wrote " << out << ": " << weights.size() << " tensors of " << model << " at step "
            << step.dump() << which << "\n";
  return 0;
}

}  // namespace trainer::cli
