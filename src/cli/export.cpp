// trainer export: writes a checkpoint's model weights as safetensors.
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_folder.h"
#include "cli/checkpoint_model.h"
#include "cli/commands.h"
#include "cli/export_hf.h"
#include "cli/export_peft.h"
#include "cli/options.h"
#include "engine/persist/checkpointer.h"
#include "models/model.h"
#include "util/fileio.h"
#include "util/log.h"

namespace trainer::cli {

namespace fs = std::filesystem;

namespace {

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

// The files an export of `format` writes at --out `out`: the file, or those written into the
// folder.
std::vector<std::string> written_files(const std::string& out, const std::string& format) {
  if (format == "hf") {
    return {(fs::path(out) / "model.safetensors").string(),
            (fs::path(out) / "config.json").string()};
  }
  if (format == "peft") {
    return {(fs::path(out) / "adapter_model.safetensors").string(),
            (fs::path(out) / "adapter_config.json").string()};
  }
  return {out};
}

// UsageError unless --out may be written: for pt a file, for hf a folder and the files written
// into it; none of them a device, a FIFO, a folder where a file goes, or the checkpoint itself.
void check_out(const std::string& out, const std::string& format, const std::string& checkpoint) {
  const auto files = written_files(out, format);
  std::string why;
  if (format == "hf" || format == "peft") why = output_problem(out, OutputKind::folder);
  for (size_t i = 0; i < files.size() && why.empty(); ++i) {
    why = output_problem(files[i], OutputKind::file);
    if (why.empty() && !output_problem(files[i], OutputKind::file, {checkpoint}).empty()) {
      throw UsageError("--out " + files[i] +
                       " is the checkpoint itself; writing the weights there would "
                       "replace the training checkpoint; choose another --out");
    }
  }
  if (!why.empty()) throw UsageError("--out " + why);
}

// UsageError when the export would write into the run's base (model.pretrained `config`'s): its
// folder (--format hf or peft) or its weights file, by any path (a symlink, `..`).
void check_not_base(const std::string& out, const std::string& format,
                    const nlohmann::json& config) {
  if (!config.contains("model.pretrained") || !config["model.pretrained"].is_string()) return;
  const std::string base = config["model.pretrained"].get<std::string>();
  std::error_code ec;
  if (base.empty() || !fs::exists(base, ec)) return;
  if (checkpoint::is_directory(base)) {
    if (format == "pt" || !fs::equivalent(base, out, ec)) return;
    throw UsageError("--out " + out + " is the run's model.pretrained folder " + base +
                     (format == "peft"
                          ? "; adapters written there would load with the base as one model "
                            "(from_pretrained reads adapter_config.json in a model folder) and "
                            "the run's base would change"
                          : "; exporting there would replace the weights it was initialised "
                            "from") +
                     "; choose another --out");
  }
  for (const auto& file : written_files(out, format)) {
    if (fs::equivalent(base, file, ec)) {
      throw UsageError("--out " + out + ": " + file +
                       " is the run's model.pretrained weights "
                       "file; exporting there would replace the weights it was initialised "
                       "from; choose another --out");
    }
  }
}

// UsageError for a --format other than pt, hf and peft, and for a flag the format would drop:
// --merge, --dtype, --max-shard-size and --tokenizer go with --format hf alone.
void check_format_flags(const cxxopts::ParseResult& args, const std::string& format) {
  if (format != "pt" && format != "hf" && format != "peft") {
    throw UsageError("--format: expected pt, hf or peft, got '" + format + "'");
  }
  if (format == "hf") return;
  for (const char* flag : {"merge", "dtype", "max-shard-size", "tokenizer"}) {
    if (!args.count(flag)) continue;
    throw UsageError(std::string("--") + flag + " goes with --format hf" +
                     (format == "peft" ? "; --format peft writes the adapters alone, as trained"
                                       : "; --format pt writes the checkpoint's weights as they "
                                         "are"));
  }
}

cxxopts::Options export_options() {
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
       "config.json, generation_config.json, the tokenizer files of the run's tokenizer) "
       "that transformers' from_pretrained loads (gpt: GPT2LMHeadModel; llama: Llama, Qwen 2 "
       "or Qwen 3)",
       cxxopts::value<std::string>()->default_value("pt"), "pt|hf|peft")
      ("merge", "--format hf of a LoRA run (model.lora): the run's base (model.pretrained) with "
       "the adapters merged into its weights")
      ("max-shard-size", "--format hf: the largest safetensors file, as save_pretrained's "
       "max_shard_size (5GB, 500MB, bytes); larger models are split into "
       "model-0000k-of-0000n.safetensors and model.safetensors.index.json",
       cxxopts::value<std::string>()->default_value("5GB"), "SIZE")
      ("dtype", "--format hf: the weights' dtype; auto: that of the run's model.pretrained "
       "folder, else the checkpoint's", cxxopts::value<std::string>()->default_value("auto"),
       "auto|float32|bfloat16|float16")
      ("tokenizer", "--format hf: the tokenizer whose files the folder gets (a tokenizer.json, a "
       "folder holding one, or GPT-2's encoder.json and vocab.bpe); default: the run's "
       "data.tokenizer, else its model.pretrained folder", cxxopts::value<std::string>(), "PATH")
      ("h,help", "print this help");
  // clang-format on
  return options;
}

}  // namespace

// trainer export: the model weights of a checkpoint as a plain safetensors file with PyTorch
// state-dict names (torchvision's for the ResNets, nanoGPT's for gpt).
int export_command(int argc, char** argv) {
  auto options = export_options();
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
  const std::string format = args["format"].as<std::string>();
  check_format_flags(args, format);
  check_out(out, format, path);
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
  check_not_base(out, format, config);
  if (format == "peft") return export_peft(path, out, state.meta, weights);  // a LoRA run's
  if (format == "hf") {
    const HfExport e{path,
                     out,
                     model,
                     config,
                     parse_shard_size(args["max-shard-size"].as<std::string>()),
                     args["dtype"].as<std::string>(),
                     args.count("tokenizer") ? args["tokenizer"].as<std::string>() : ""};
    return export_hf(e, hf_weights(path, state.meta, weights, args.count("merge") > 0));
  }
  const auto metadata = pt_metadata(state, model, step);
  write_atomically(
      out, [&](const ByteSink& sink) { checkpoint::write_safetensors(weights, metadata, sink); });
  std::cout << "wrote " << out << ": " << weights.size() << " tensors of " << model << " at step "
            << step.dump() << which << "\n";
  return 0;
}

}  // namespace trainer::cli
