#include "cli/checkpoint_model.h"

#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_folder.h"
#include "cli/commands.h"
#include "data/tokens/chat.h"
#include "models/model.h"
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

// The rows of a whole checkpoint's token embedding (llama's embed_tokens, gpt's wte): the
// vocabulary its model was built with; 0 when it holds none.
int64_t embedding_rows(const checkpoint::State& state) {
  for (const auto& [name, t] : state.tensors) {
    const auto ends = [&](const std::string& tail) {
      return name.size() > tail.size() &&
             name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (name.rfind("model.", 0) == 0 && t.dim() == 2 &&
        (ends(".embed_tokens.weight") || ends(".wte.weight"))) {
      return t.size(0);
    }
  }
  return 0;
}

// Replaces `built`'s data with one sample of synthetic tokens of `vocabulary` ids (a language
// model's input and output sizes without the run's data, which generate does not read); keeps
// it when the vocabulary is unknown (0) or the model reads no tokens (it has no context length).
void without_data(config::LoadedConfig& built, int64_t vocabulary) {
  const auto& registry = models::model_registry();
  const auto& name = built.cfg.model.name;
  if (vocabulary <= 0 || !registry.contains(name) || !registry.get(name).context_length) return;
  auto& d = built.cfg.data;
  d.name = "synthetic_tokens";
  d.mix = {};
  d.options.set("num_classes", vocabulary);
  d.options.set("seq_len", int64_t{0});
  d.options.set("train_samples", int64_t{1});
  d.options.set("val_samples", int64_t{0});
  d.batch_size = 1;
  d.eval_batch_size = 0;
  d.workers = 0;
}

// The model's vocabulary as a config gives it (model.vocab_size; 0 when the data gives it).
int64_t config_vocabulary(const config::LoadedConfig& loaded) {
  const auto v = config::lookup(loaded.cfg, "model.vocab_size");
  try {
    return v ? std::stoll(*v) : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

// A LoRA checkpoint's base identity (meta["lora"]["base"]); "" for a checkpoint of a whole model.
std::string adapter_base(const nlohmann::json& meta) {
  if (!meta.is_object() || !meta.contains("lora") || !meta["lora"].is_object()) return "";
  const auto& base = meta["lora"];
  return base.contains("base") && base["base"].is_string() ? base["base"].get<std::string>() : "";
}

// Config `path` with `overrides`, the model.* keys it leaves at their defaults taken from the
// checkpoint's config `saved` (a config without the keys model.pretrained's config.json set),
// recorded as set there. model.pretrained is left as `path` and `overrides` give it.
config::LoadedConfig with_saved_model_keys(const std::string& path,
                                           const std::vector<std::string>& overrides,
                                           const nlohmann::json& saved,
                                           const std::string& checkpoint) {
  const auto defaults = engine::config_defaults();
  auto loaded = config::load(path, overrides, defaults);
  std::vector<std::string> taken, keys;
  for (auto it = saved.begin(); it != saved.end(); ++it) {
    const std::string& key = it.key();
    if (key.rfind("model.", 0) != 0 || key == "model.pretrained" || !it->is_string() ||
        loaded.origins.count(key)) {
      continue;
    }
    const auto ours = config::lookup(loaded.cfg, key);
    if (!ours || *ours == it->get<std::string>()) continue;
    taken.push_back(key + "=" + it->get<std::string>());
    keys.push_back(key);
  }
  if (taken.empty()) return loaded;
  taken.insert(taken.end(), overrides.begin(), overrides.end());
  loaded = config::load(path, taken, defaults);
  for (const auto& key : keys) loaded.origins[key] = config::Location{checkpoint, 0, 0};
  return loaded;
}

// The config as the run names it (`named`: model.pretrained, data) and the one the Trainer is
// built from (`built`).
struct UseConfigs {
  config::LoadedConfig named, built;
};

// A whole model's checkpoint: the model its config gives, built without model.pretrained's
// folder (the weights are the checkpoint's); the folder only gives what it alone holds, chat
// data's default tokenizer (data.tokenizer). Preference tuning (train.objective: dpo) keeps the
// folder: a full fine-tune's reference is a frozen copy of its weights, taken before the
// checkpoint's replace them, and its pairs' default tokenizer is the folder's.
UseConfigs whole_model_configs(const Resolved& r, const std::vector<std::string>& overrides) {
  const auto named =
      with_saved_model_keys(r.config, overrides, r.state->meta["config"], r.checkpoint);
  UseConfigs u{named, named};
  auto& cfg = u.built.cfg;
  if (cfg.train.objective == "dpo") {
    config::check(u.built, engine::config_environment());
    return u;
  }
  const std::string folder = cfg.model.pretrained;
  cfg.model.pretrained.clear();
  if (cfg.data.name == "chat" && cfg.data.own<data::ChatOptions>().tokenizer.empty()) {
    std::error_code ec;  // a weights file's folder; a folder, or a path to nothing, as it is
    const std::string dir =
        fs::is_regular_file(folder, ec) ? fs::path(folder).parent_path().string() : folder;
    cfg.data.options.set("tokenizer", dir.empty() ? std::string(".") : dir);
    u.built.origins["data.tokenizer"] = u.named.where("model.pretrained");
  }
  config::check(u.built, engine::config_environment());
  return u;
}

// A LoRA checkpoint's base must be where model.pretrained names it (any copy of it: a base is
// recognised by its contents): ConfigError naming model.pretrained when nothing is there.
void require_lora_base(const config::LoadedConfig& loaded, const std::string& base,
                       const std::string& checkpoint) {
  const std::string& pretrained = loaded.cfg.model.pretrained;
  std::error_code ec;
  if (pretrained.empty() || fs::exists(pretrained, ec)) return;
  throw config::ConfigError({config::Issue{
      loaded.where("model.pretrained"), "model.pretrained",
      pretrained + ", the base the LoRA adapters of " + checkpoint + " were trained on (identity " +
          base +
          "), is not there; give --set model.pretrained=PATH of the same base (a copy "
          "anywhere: the base is recognised by its contents)"}});
}

// The configs of --checkpoint's model: a whole model's from the checkpoint (whole_model_configs),
// else (LoRA adapters, a model built from the seed) `r.config` read as training reads it.
UseConfigs use_configs(const Resolved& r, const std::vector<std::string>& overrides) {
  const auto& meta = r.state->meta;
  const std::string base = adapter_base(meta);
  const bool saved_config =
      meta.is_object() && meta.contains("config") && meta["config"].is_object();
  if (base.empty() && saved_config) {
    auto peek = config::load(r.config, overrides, engine::config_defaults());
    if (!peek.cfg.model.pretrained.empty()) return whole_model_configs(r, overrides);
  }
  if (!base.empty()) {
    require_lora_base(config::load(r.config, overrides, engine::config_defaults()), base,
                      r.checkpoint);
  }
  const auto named = load_config(r.config, overrides, engine::config_environment());
  return {named, named};
}

// The model of --config alone: its model.pretrained weights (loaded as training starts from them),
// at step 0.
CheckpointModel pretrained_model(const cxxopts::ParseResult& args, const distributed::DistEnv& job,
                                 const std::string& command, bool needs_data) {
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
  auto built = m.loaded;
  for_use(built);
  if (!needs_data) without_data(built, config_vocabulary(built));
  m.trainer = std::make_unique<engine::Trainer>(built, job);
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
                                      engine::LabelUse labels, bool needs_data) {
  if (!args.count("checkpoint") && !args.count("config")) {
    throw UsageError(command +
                     ": --checkpoint PATH|RUN_DIR is required (or --config FILE whose "
                     "model.pretrained holds the weights)");
  }
  setup_logging(args["log-level"].as<std::string>(), job);
  if (!args.count("checkpoint")) return pretrained_model(args, job, command, needs_data);
  auto resolved =
      checkpoint_and_config(args["checkpoint"].as<std::string>(),
                            args.count("config") ? args["config"].as<std::string>() : "");
  if (!resolved.state) resolved.state = checkpoint::load(resolved.checkpoint);
  auto configs = use_configs(resolved, set_and_device(args));
  for_use(configs.built);
  if (!needs_data) {
    const int64_t v = config_vocabulary(configs.built);
    without_data(configs.built, v > 0 ? v : embedding_rows(*resolved.state));
  }
  CheckpointModel m{resolved.checkpoint, std::move(configs.named), nullptr, 0, ""};
  m.trainer = std::make_unique<engine::Trainer>(configs.built, job);
  m.step = m.trainer->load_model(m.checkpoint, labels, &*resolved.state, weights_use(args));
  m.weights = m.trainer->loaded_average() ? "ema" : "raw";
  log::info(m.weights == "ema"
                ? "weights: ema, the checkpoint's average of the weights (train.ema); --weights "
                  "raw uses the trained ones"
                : "weights: raw, the trained weights of the checkpoint");
  return m;
}

}  // namespace trainer::cli
