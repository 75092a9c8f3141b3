#include "engine/persist/checkpointer.h"

#include <sys/stat.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>

#include "engine/persist/sharded_state.h"
#include "engine/persist/tensor_parallel_state.h"
#include "engine/setup/adapter_state.h"
#include "nn/rng.h"
#include "util/device.h"
#include "util/format.h"
#include "util/log.h"
#include "util/net/url.h"

namespace trainer::engine {
namespace {

constexpr const char* kModelPrefix = Checkpointer::kModelPrefix;
constexpr const char* kOptimPrefix = Checkpointer::kOptimPrefix;
constexpr const char* kScalerPrefix = "scaler.";
constexpr const char* kWindowLoss = "engine.window_loss";
constexpr const char* kWindowGradNorm = "engine.window_grad_norm";
constexpr int kFormat = 1;

// The keys a checkpoint must be loaded with as it was written: the model's (model.pretrained is
// not among them: a whole model's weights are in the checkpoint, and LoRA adapters check their
// base by its contents), and, to resume, what the training state belongs to.
bool must_match(const std::string& key, bool resuming) {
  if (key.rfind("model.", 0) == 0) return key != "model.checkpointing" && key != "model.pretrained";
  return resuming && (key == "optim.name" || key == "data.name" || key == "train.loss");
}

int cuda_device_count() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

// Writes the TrainingState's counters into a JSON object.
struct ToJson {
  nlohmann::json& meta;
  void operator()(const char* name, const int64_t& field, bool /*required*/) { meta[name] = field; }
};

// Reads them back; a required counter that is missing makes the checkpoint unusable.
struct FromJson {
  const nlohmann::json& meta;
  const std::string& path;
  void operator()(const char* name, int64_t& field, bool required) {
    if (meta.contains(name) && meta[name].is_number_integer()) {
      field = meta[name].get<int64_t>();
    } else if (required) {
      throw checkpoint::CorruptCheckpoint(path + ": no integer '" + name + "' in its metadata");
    } else {
      field = 0;
    }
  }
};

// The schedule's length and the learning rate of the next update, which a resume with another
// schedule compares (Checkpointer::warn_schedule_change).
nlohmann::json schedule_meta(const Components& parts, const TrainingState& state) {
  return {{"total_steps", parts.total_steps}, {"next_lr", parts.schedule->lr(state.updates())}};
}

}  // namespace

int64_t kept_checkpoints(const config::Config& cfg) {
  const int64_t keep = cfg.run.keep_last;
  return cfg.train.rollback_on_nan ? std::max(keep, cfg.train.max_rollbacks + 1) : keep;
}

checkpoint::NamedTensors model_weights(const checkpoint::State& ckpt) {
  return checkpoint::with_prefix(ckpt.tensors, kModelPrefix);
}

Checkpointer::Checkpointer(const config::LoadedConfig& loaded, Components& parts,
                           TrainingState& state, const distributed::DistEnv& job,
                           std::vector<SavedPart*> extras)
    : loaded_(loaded),
      parts_(parts),
      state_(state),
      job_(job),
      extras_(std::move(extras)),
      dir_(std::make_unique<checkpoint::Directory>(loaded.cfg.run.dir + "/checkpoints",
                                                   kept_checkpoints(loaded.cfg),
                                                   loaded.cfg.run.keep_best)) {}

bool Checkpointer::resume(const std::string& spec) {
  // Rank 0 picks the checkpoint; every rank loads that file.
  std::optional<std::pair<std::string, checkpoint::State>> latest;
  std::string path = spec;
  std::error_code ec;
  const bool run_dir = spec != "auto" && std::filesystem::is_directory(spec, ec);
  if ((spec == "auto" || run_dir) && job_.rank == 0) {
    // auto: this run's checkpoints; a run dir: that run's newest that verifies.
    latest = run_dir ? checkpoint::Directory(spec + "/checkpoints", 1, "").load_latest()
                     : dir_->load_latest();
    path = latest ? latest->first : "";
  }
  if (parts_.group) path = parts_.group->broadcast_text(path, /*root=*/0);
  if (path.empty() && run_dir) {
    config::Issue issue;
    issue.where.file = "--resume " + spec;
    issue.message =
        "the run dir holds no checkpoint (checkpoints/); give another run dir, a "
        "checkpoint file, or --resume auto";
    throw config::ConfigError({issue});
  }
  if (path.empty()) {
    log::info("no checkpoint in " + dir_->path() + "; starting from step 0");
    return false;
  }
  if (spec == "auto" && job_.rank == 0) {
    try {
      dir_->enter_unlisted();
    } catch (const std::exception& e) {  // the next save tries again
      log::warn(std::string(e.what()) + "; the manifest still lacks a checkpoint file beside it");
    }
  }
  checkpoint::State ckpt = latest ? std::move(latest->second) : checkpoint::load(path);
  const nlohmann::json schedule = ckpt.meta.value("schedule", nlohmann::json::object());
  restore(ckpt, path);
  log::info(strprintf("resumed from %s at step %" PRId64 " (epoch %" PRId64
                      ", after its step %" PRId64 ")",
                      last_.c_str(), state_.step, state_.epoch, state_.step_in_epoch));
  warn_schedule_change(schedule);
  return true;
}

checkpoint::State Checkpointer::snapshot() const {
  checkpoint::State out;
  // Sharded: the parameters and the optimizer's state are in the ranks' shard files.
  const auto sharded = parts_.fsdp ? parameter_entries(*parts_.model) : std::set<std::string>{};
  for (const auto& [name, tensor] : saved_model_state(parts_)) {  // LoRA: the adapters alone
    if (!sharded.count(name)) out.tensors.emplace_back(kModelPrefix + name, tensor);
  }
  if (!parts_.fsdp) {
    for (auto& [name, tensor] : parts_.optimizer->state()) {
      out.tensors.emplace_back(kOptimPrefix + name, tensor);
    }
  }
  out.tensors.emplace_back("rng.cpu", nn::generator_state(nn::cpu_generator()));
  for (int i = 0; i < cuda_device_count(); ++i) {
    out.tensors.emplace_back("rng.cuda." + std::to_string(i),
                             nn::generator_state(nn::cuda_generator(i)));
  }
  out.tensors.emplace_back(kWindowLoss, state_.window_loss);
  if (state_.window_grad_norm.defined()) {
    out.tensors.emplace_back(kWindowGradNorm, state_.window_grad_norm);
  }
  for (const SavedPart* part : extras_) {
    for (const auto& [name, tensor] : part->tensors()) {
      out.tensors.emplace_back(part->prefix() + name, tensor);
    }
  }
  if (parts_.scaler) {
    for (const auto& [name, tensor] : parts_.scaler->state()) {
      out.tensors.emplace_back(kScalerPrefix + name, tensor);
    }
  }
  nlohmann::json config = nlohmann::json::object();
  for (const auto& [key, value] : config::flatten(loaded_.cfg)) config[key] = value;
  out.meta = {{"format", kFormat},
              {"config", config},
              {"classes", parts_.splits.spec.class_names},
              {"versions",
               {{"trainer", TRAINER_VERSION},
                {"libtorch", TORCH_VERSION},
                {"cuda_devices", cuda_device_count()}}}};
  add_adapter_meta(parts_, out.meta);  // LoRA: the base's identity
  // The classifier's outputs (export's metadata: the torchvision model to build).
  if (!parts_.splits.spec.sequence) out.meta["num_classes"] = parts_.input.num_classes;
  // Tensor parallelism: each split tensor whole, joined over the group (fsdp: its parts are in the
  // shard files, tensor_parallel_pieces, joined when read).
  if (parts_.tp) {
    out.meta["tensor_parallel"] = {{"size", parts_.tp_size()}};
    if (!parts_.fsdp) out.tensors = joined_over_group(parts_, std::move(out.tensors));
  }
  ToJson to_json{out.meta};
  TrainingState counters = state_;
  counters.visit(to_json);
  const DataPosition here = position_now();
  out.meta["data_position"] = {{"epoch_samples", state_.step_in_epoch * here.global_batch()},
                               {"world_size", here.world_size},
                               {"batch_size", here.batch_size},
                               {"grad_accum_steps", here.grad_accum_steps}};
  out.meta["schedule"] = schedule_meta(parts_, state_);
  return out;
}

Checkpointer::DataPosition Checkpointer::position_now() const {
  const auto& cfg = loaded_.cfg;
  return {parts_.data_parallel_size(), cfg.data.batch_size, cfg.train.grad_accum_steps};
}

checkpoint::State Checkpointer::for_this_rank(const checkpoint::State& ckpt) const {
  if (!parts_.tp) return ckpt;
  return {local_parts(parts_, ckpt.tensors), ckpt.meta};
}

void Checkpointer::restore(const checkpoint::State& whole, const std::string& path) {
  const checkpoint::State ckpt = for_this_rank(whole);
  restore_model(ckpt, path, LabelUse::train_and_score, /*resuming=*/true);
  restore_tensors(ckpt, path);
  restore_position(ckpt.meta, path);
  resumed_step_ = saved_step_ = state_.step;
  last_ = path;
}

int64_t Checkpointer::load_model(const std::string& path, LabelUse labels,
                                 const checkpoint::State* loaded, WeightsUse weights) {
  const checkpoint::State ckpt = for_this_rank(loaded ? *loaded : checkpoint::load(path));
  restore_model(ckpt, path, labels, /*resuming=*/false, weights);
  if (!ckpt.meta.contains("step") || !ckpt.meta["step"].is_number_integer()) {
    throw checkpoint::CorruptCheckpoint(path + ": no integer 'step' in its metadata");
  }
  return ckpt.meta["step"].get<int64_t>();
}

// The metadata's format and config, the model weights and the class names.
void Checkpointer::restore_model(const checkpoint::State& ckpt, const std::string& path,
                                 LabelUse labels, bool resuming, WeightsUse weights) {
  const auto& meta = ckpt.meta;
  if (!meta.is_object() || meta.value("format", 0) != kFormat || !meta.contains("config")) {
    throw checkpoint::CorruptCheckpoint(path + ": not a checkpoint of this trainer version");
  }
  check_config(meta.at("config"), path, resuming);
  checkpoint::NamedTensors chosen;
  if (weights != WeightsUse::trained) chosen = averaged_weights(ckpt);
  if (chosen.empty() && weights == WeightsUse::average) {
    throw config::ConfigError({config::Issue{
        loaded_.where("train.ema.decay"), "--weights ema",
        "the checkpoint " + path +
            " holds no average of the weights (it was trained without train.ema); use "
            "--weights raw"}});
  }
  used_average_ = !chosen.empty();
  if (chosen.empty()) chosen = model_weights(ckpt);
  const std::string problems =
      !parts_.lora_base.empty() ? load_adapters(parts_, loaded_, meta, chosen, path)
      : parts_.fsdp             ? load_sharded_weights(parts_, chosen)
                                : models::load_weights(*parts_.model, chosen, /*skip_head=*/false);
  if (!problems.empty()) {
    throw config::ConfigError({config::Issue{loaded_.where("model.name"), "model.name",
                                             "the checkpoint " + path + " does not fit model " +
                                                 loaded_.cfg.model.name + ": " + problems}});
  }
  match_classes(saved_classes(meta, path), path, labels);
}

std::vector<std::string> Checkpointer::saved_classes(const nlohmann::json& meta,
                                                     const std::string& path) const {
  if (!meta.contains("classes")) return {};  // older checkpoints have none
  const auto& classes = meta["classes"];
  std::vector<std::string> out;
  const std::string fix = "; restore the file, or give --config with the data it was trained on";
  if (!classes.is_array()) {
    throw checkpoint::CorruptCheckpoint(path + ": its metadata's classes are not a list" + fix);
  }
  for (const auto& c : classes) {
    if (!c.is_string()) {
      throw checkpoint::CorruptCheckpoint(path + ": its metadata's classes hold " + c.dump() +
                                          ", not a name" + fix);
    }
    out.push_back(c.get<std::string>());
  }
  const int64_t k = parts_.input.num_classes;
  if (!out.empty() && !parts_.splits.spec.sequence && static_cast<int64_t>(out.size()) != k) {
    throw checkpoint::CorruptCheckpoint(
        strprintf("%s: its metadata names %zu classes for a model of %" PRId64 " outputs%s",
                  path.c_str(), out.size(), k, fix.c_str()));
  }
  return out;
}

void Checkpointer::match_classes(const std::vector<std::string>& saved, const std::string& path,
                                 LabelUse labels) {
  auto& names = parts_.splits.spec.class_names;
  if (saved.empty() || saved == names) return;
  // The model predicts the checkpoint's classes; the data's names matter where its labels do.
  if (names.empty() || labels == LabelUse::none) {
    names = saved;
    return;
  }
  const auto list = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& n : v) out += (out.empty() ? "" : ", ") + nlohmann::json(n).dump();
    return "[" + out + "]";
  };
  const std::string both = "the data's classes " + list(names) +
                           " differ from the classes the checkpoint " + path + " was trained on, " +
                           list(saved);
  if (!loaded_.cfg.data.remap_classes) {
    throw config::ConfigError({config::Issue{
        loaded_.where("data.remap_classes"), "data.remap_classes",
        both + ": each label would mean another class; use the data it was trained on, or set "
               "data.remap_classes: true to match the classes by name"}});
  }
  std::vector<int64_t> to_saved;  // data label -> checkpoint label
  for (const auto& n : names) {
    const auto it = std::find(saved.begin(), saved.end(), n);
    if (it == saved.end() || saved.size() != names.size()) {
      throw config::ConfigError({config::Issue{
          loaded_.where("data.remap_classes"), "data.remap_classes",
          both + ": matching by name needs the same names, in any order (" +
              nlohmann::json(n).dump() + " is not among the checkpoint's, or the counts differ)"}});
    }
    to_saved.push_back(it - saved.begin());
  }
  relabel(parts_, loaded_.cfg, job_, to_saved);
  names = saved;
  log::info("data.remap_classes: the data's labels mapped by name onto the checkpoint's " +
            list(saved));
}

// The config: what must match, and what changed harmlessly.
void Checkpointer::warn_schedule_change(const nlohmann::json& saved) const {
  if (!saved.contains("next_lr") || !saved["next_lr"].is_number()) return;  // older checkpoints
  const double then = saved["next_lr"].get<double>();
  const double now = parts_.schedule->lr(state_.updates());
  if (std::abs(now - then) <= 1e-12 * std::max(std::abs(then), 1e-30)) return;
  log::warn(strprintf(
      "resuming at step %" PRId64 " with another learning-rate schedule (over %" PRId64
      " steps, the checkpoint's run over %" PRId64
      "): the next step's learning rate is %.6g, "
      "%.6g in the checkpoint's run; the schedule from here on is the new one",
      state_.step, parts_.total_steps, saved.value("total_steps", int64_t{0}), now, then));
}

void Checkpointer::check_config(const nlohmann::json& saved, const std::string& path,
                                bool resuming) const {
  std::vector<config::Issue> conflicts;
  for (const auto& [key, value] : config::flatten(loaded_.cfg)) {
    if (!saved.contains(key)) continue;
    // Masked as flatten() masks: a checkpoint's URL credentials are never compared or shown.
    const std::string before = mask_url_credentials(saved[key].get<std::string>());
    if (before == value) continue;
    if (must_match(key, resuming)) {
      conflicts.push_back(config::Issue{
          loaded_.where(key), key,
          "is " + value + " but the checkpoint " + path + " was written with " + before +
              (resuming ? "; resume with the same value or start a new run"
                        : "; load it with the value it was written with")});
    } else if (resuming) {
      log::info("resuming with " + key + " changed: " + before + " -> " + value);
    }
  }
  if (!conflicts.empty()) throw config::ConfigError(std::move(conflicts));
}

void Checkpointer::restore_tensors(const checkpoint::State& ckpt, const std::string& path) {
  std::map<std::string, torch::Tensor> tensors(ckpt.tensors.begin(), ckpt.tensors.end());
  auto take = [&](const std::string& name) {
    auto it = tensors.find(name);
    if (it == tensors.end())
      throw checkpoint::CorruptCheckpoint(path + ": no '" + name + "' tensor");
    return it->second;
  };
  const auto optim_state = checkpoint::with_prefix(ckpt.tensors, kOptimPrefix);
  try {
    std::map<std::string, torch::Tensor> whole(optim_state.begin(), optim_state.end());
    parts_.optimizer->load_state(parts_.fsdp ? sharded_optimizer_state(parts_, whole) : whole);
  } catch (const std::runtime_error& e) {
    throw checkpoint::CorruptCheckpoint(path + ": " + e.what());
  }
  nn::set_generator_state(nn::cpu_generator(), take("rng.cpu"));
  for (int i = 0; i < cuda_device_count(); ++i) {
    auto it = tensors.find("rng.cuda." + std::to_string(i));
    if (it == tensors.end()) continue;  // written without this device
    nn::set_generator_state(nn::cuda_generator(i), it->second);
  }
  state_.window_loss = take(kWindowLoss).to(parts_.device);
  const auto norm = tensors.find(kWindowGradNorm);
  state_.window_grad_norm =
      norm == tensors.end() ? torch::Tensor() : norm->second.to(parts_.device);
  for (SavedPart* part : extras_)
    part->restore(checkpoint::with_prefix(ckpt.tensors, part->prefix()), path);
  if (!parts_.scaler) return;
  const auto scaler = checkpoint::with_prefix(ckpt.tensors, kScalerPrefix);
  if (scaler.empty()) {
    log::info("the checkpoint has no gradient scaler state; the scale starts at amp.init_scale");
    return;
  }
  try {
    parts_.scaler->load_state({scaler.begin(), scaler.end()});
  } catch (const std::runtime_error& e) {
    throw checkpoint::CorruptCheckpoint(path + ": " + e.what());
  }
}

void Checkpointer::restore_position(const nlohmann::json& meta, const std::string& path) {
  FromJson from_json{meta, path};
  state_.visit(from_json);
  const DataPosition now = position_now();
  const DataPosition then = saved_position(meta, path);
  if (then.global_batch() != now.global_batch()) {
    throw config::ConfigError({config::Issue{loaded_.where("data.batch_size"), "data.batch_size",
                                             position_mismatch(then, now, path)}});
  }
  const auto& saved = meta.contains("data_position") ? meta["data_position"] : nlohmann::json();
  if (saved.is_object() &&
      saved.value("epoch_samples", int64_t{-1}) != state_.step_in_epoch * then.global_batch()) {
    throw checkpoint::CorruptCheckpoint(path + ": its data position (" +
                                        saved.value("epoch_samples", nlohmann::json()).dump() +
                                        " samples) disagrees with its step_in_epoch");
  }
  // The same global batch takes the same samples per step on any number of ranks (each rank's
  // shard interleaves the epoch's order), so the step in the epoch carries over.
  if (state_.step_in_epoch > parts_.steps_per_epoch) {
    throw config::ConfigError(
        {config::Issue{loaded_.where("data.name"), "data.name",
                       "the checkpoint " + path + " stopped after " +
                           std::to_string(state_.step_in_epoch * then.global_batch()) +
                           " samples of an epoch, which now has only " +
                           std::to_string(parts_.steps_per_epoch * now.global_batch()) +
                           " training samples; resume with the data it was written with"}});
  }
  if (then.world_size != now.world_size) {
    log::info(strprintf("resuming a run of %d ranks on %d, at sample %" PRId64 " of epoch %" PRId64
                        " (the global batch of %" PRId64 " unchanged)",
                        then.world_size, now.world_size, state_.step_in_epoch * now.global_batch(),
                        state_.epoch, now.global_batch()));
  }
}

Checkpointer::DataPosition Checkpointer::saved_position(const nlohmann::json& meta,
                                                        const std::string& path) const {
  const auto& p = meta.contains("data_position") ? meta["data_position"] : nlohmann::json();
  if (p.is_object()) {
    DataPosition out;
    for (auto [key, field] : {std::pair<const char*, int64_t*>{"batch_size", &out.batch_size},
                              {"grad_accum_steps", &out.grad_accum_steps}}) {
      if (!p.contains(key) || !p[key].is_number_integer() || p[key].get<int64_t>() < 1) {
        throw checkpoint::CorruptCheckpoint(path + ": no positive integer '" + key +
                                            "' in its data_position");
      }
      *field = p[key].get<int64_t>();
    }
    if (!p.contains("world_size") || !p["world_size"].is_number_integer() ||
        p["world_size"].get<int64_t>() < 1) {
      throw checkpoint::CorruptCheckpoint(path + ": no positive integer 'world_size' in its " +
                                          "data_position");
    }
    out.world_size = static_cast<int>(p["world_size"].get<int64_t>());
    return out;
  }
  // Written before checkpoints recorded the data position: its config's batch settings, and the
  // ranks of this job (the only resume those versions supported alike).
  DataPosition out = position_now();
  const auto& config = meta.at("config");
  for (auto [key, field] : {std::pair<const char*, int64_t*>{"data.batch_size", &out.batch_size},
                            {"train.grad_accum_steps", &out.grad_accum_steps}}) {
    if (config.contains(key) && config[key].is_string()) {
      try {
        *field = std::stoll(config[key].get<std::string>());
      } catch (const std::exception&) {
        throw checkpoint::CorruptCheckpoint(path + ": its config's " + key + " is not a number");
      }
    }
  }
  return out;
}

std::string Checkpointer::position_mismatch(const DataPosition& then, const DataPosition& now,
                                            const std::string& path) {
  const auto text = [](const DataPosition& p) {
    return strprintf("%d rank%s x data.batch_size %" PRId64 " x train.grad_accum_steps %" PRId64
                     " = %" PRId64 " samples per step",
                     p.world_size, p.world_size == 1 ? "" : "s", p.batch_size, p.grad_accum_steps,
                     p.global_batch());
  };
  const int64_t want = then.global_batch();
  std::string fix;
  if (want % (now.world_size * now.grad_accum_steps) == 0) {
    fix = strprintf("set data.batch_size to %" PRId64,
                    want / (now.world_size * now.grad_accum_steps));
  } else if (want % (now.world_size * now.batch_size) == 0) {
    fix = strprintf("set train.grad_accum_steps to %" PRId64,
                    want / (now.world_size * now.batch_size));
  } else if (want % now.world_size == 0) {
    fix = strprintf("set data.batch_size to %" PRId64 " and train.grad_accum_steps to 1",
                    want / now.world_size);
  } else {
    fix = strprintf("resume on a number of ranks that divides %" PRId64, want);
  }
  return "the checkpoint " + path + " was written by " + text(then) + ", this job has " +
         text(now) + "; resuming would skip or repeat data: " + fix +
         " (the same samples per step), or start a new run";
}

checkpoint::NamedTensors averaged_weights(const checkpoint::State& ckpt) {
  const auto average = checkpoint::with_prefix(ckpt.tensors, "ema.");
  if (average.empty()) return {};
  const std::map<std::string, torch::Tensor> by_name(average.begin(), average.end());
  checkpoint::NamedTensors out = checkpoint::with_prefix(ckpt.tensors, "model.");
  for (auto& [name, tensor] : out) {
    const auto it = by_name.find(name);
    if (it != by_name.end()) tensor = it->second;
  }
  return out;
}

}  // namespace trainer::engine
