#include "engine/checkpointer.h"

#include <sys/stat.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <map>

#include "engine/sharded_state.h"
#include "nn/rng.h"
#include "util/device.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::engine {
namespace {

constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimPrefix = "optim.";
constexpr const char* kScalerPrefix = "scaler.";
constexpr const char* kWindowLoss = "engine.window_loss";
constexpr int kFormat = 1;

// Config keys whose change makes a checkpoint unusable: the weights' layout and what they mean.
bool must_match(const std::string& key) {
  return (key.rfind("model.", 0) == 0 && key != "model.checkpointing") || key == "optim.name" ||
         key == "data.name" || key == "train.loss";
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

}  // namespace

checkpoint::NamedTensors model_weights(const checkpoint::State& ckpt) {
  return checkpoint::with_prefix(ckpt.tensors, kModelPrefix);
}

Checkpointer::Checkpointer(const config::LoadedConfig& loaded, Components& parts,
                           TrainingState& state, const distributed::DistEnv& job)
    : loaded_(loaded),
      parts_(parts),
      state_(state),
      job_(job),
      dir_(std::make_unique<checkpoint::Directory>(loaded.cfg.run.dir + "/checkpoints",
                                                   loaded.cfg.run.keep_last,
                                                   loaded.cfg.run.keep_best)) {}

bool Checkpointer::resume(const std::string& spec) {
  // Rank 0 picks the checkpoint; every rank loads that file.
  std::optional<std::pair<std::string, checkpoint::State>> latest;
  std::string path = spec;
  if (spec == "auto" && job_.rank == 0) {
    latest = dir_->load_latest();
    path = latest ? latest->first : "";
  }
  if (parts_.group) path = parts_.group->broadcast_text(path, /*root=*/0);
  if (path.empty()) {
    log::info("no checkpoint in " + dir_->path() + "; starting from step 0");
    return false;
  }
  restore(latest ? std::move(latest->second) : checkpoint::load(path), path);
  log::info(strprintf("resumed from %s at step %" PRId64 " (epoch %" PRId64
                      ", after its step %" PRId64 ")",
                      last_.c_str(), state_.step, state_.epoch, state_.step_in_epoch));
  return true;
}

checkpoint::State Checkpointer::snapshot() const {
  checkpoint::State out;
  // Sharded: the parameters and the optimizer's state are in the ranks' shard files.
  const auto sharded = parts_.fsdp ? parameter_entries(*parts_.model) : std::set<std::string>{};
  for (const auto& [name, tensor] : models::state_dict(*parts_.model)) {
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
  ToJson to_json{out.meta};
  TrainingState counters = state_;
  counters.visit(to_json);
  return out;
}

void Checkpointer::restore(const checkpoint::State& ckpt, const std::string& path) {
  restore_model(ckpt, path);
  restore_tensors(ckpt, path);
  restore_position(ckpt.meta, path);
  resumed_step_ = saved_step_ = state_.step;
  last_ = path;
}

int64_t Checkpointer::load_model(const std::string& path) {
  const checkpoint::State ckpt = checkpoint::load(path);
  restore_model(ckpt, path);
  if (!ckpt.meta.contains("step") || !ckpt.meta["step"].is_number_integer()) {
    throw checkpoint::CorruptCheckpoint(path + ": no integer 'step' in its metadata");
  }
  return ckpt.meta["step"].get<int64_t>();
}

// The metadata's format and config, the model weights and the class names.
void Checkpointer::restore_model(const checkpoint::State& ckpt, const std::string& path) {
  const auto& meta = ckpt.meta;
  if (!meta.is_object() || meta.value("format", 0) != kFormat || !meta.contains("config")) {
    throw checkpoint::CorruptCheckpoint(path + ": not a checkpoint of this trainer version");
  }
  check_config(meta.at("config"), path);
  const std::string problems =
      parts_.fsdp ? load_sharded_weights(parts_, model_weights(ckpt))
                  : models::load_weights(*parts_.model, model_weights(ckpt), /*skip_head=*/false);
  if (!problems.empty()) {
    throw config::ConfigError({config::Issue{loaded_.where("model.name"), "model.name",
                                             "the checkpoint " + path + " does not fit model " +
                                                 loaded_.cfg.model.name + ": " + problems}});
  }
  // The names the checkpoint was trained with (older checkpoints have none: the data's stay).
  if (meta.contains("classes") && meta["classes"].is_array() && !meta["classes"].empty()) {
    parts_.splits.spec.class_names = meta["classes"].get<std::vector<std::string>>();
  }
}

// The config: what must match, and what changed harmlessly.
void Checkpointer::check_config(const nlohmann::json& saved, const std::string& path) const {
  std::vector<config::Issue> conflicts;
  for (const auto& [key, value] : config::flatten(loaded_.cfg)) {
    if (!saved.contains(key)) continue;
    const std::string before = saved[key].get<std::string>();
    if (before == value) continue;
    if (must_match(key)) {
      conflicts.push_back(config::Issue{loaded_.where(key), key,
                                        "is " + value + " but the checkpoint " + path +
                                            " was written with " + before +
                                            "; resume with the same value or start a new run"});
    } else {
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
  if (state_.step_in_epoch > parts_.steps_per_epoch) {
    throw config::ConfigError({config::Issue{
        loaded_.where("data.batch_size"), "data.batch_size",
        "the checkpoint " + path + " stopped after step " + std::to_string(state_.step_in_epoch) +
            " of an epoch, which now has only " + std::to_string(parts_.steps_per_epoch) +
            " steps; resume with the batch size and data it was written with"}});
  }
}

nlohmann::json Checkpointer::write_shards(std::string& error) const {
  std::string mine;
  try {
    mine = checkpoint::write_shard(dir_->path(), state_.step, job_.rank, parts_.world_size(),
                                   sharded_pieces(parts_, kModelPrefix, kOptimPrefix))
               .dump();
  } catch (const std::exception& e) {
    mine = "!rank " + std::to_string(job_.rank) + ": " + e.what();
  }
  // Every rank's description (or failure) to rank 0, one rank at a time.
  nlohmann::json all = nlohmann::json::array();
  for (int r = 0; r < parts_.world_size(); ++r) {
    const std::string text =
        parts_.group ? parts_.group->broadcast_text(job_.rank == r ? mine : "", r) : mine;
    if (job_.rank != 0) continue;
    if (!text.empty() && text[0] == '!') {
      error += (error.empty() ? "" : "; ") + text.substr(1);
    } else {
      all.push_back(nlohmann::json::parse(text));
    }
  }
  return all;
}

void Checkpointer::save(const EvalResult& eval) {
  if (saved_step_ == state_.step) return;
  write(eval);
  saved_step_ = state_.step;
}

void Checkpointer::write(const EvalResult& eval) {
  std::map<std::string, double> metrics;
  if (state_.last_eval_step == state_.step && eval.samples > 0) {
    metrics = {{"loss", eval.loss}, {"top1", eval.top1}, {"top5", eval.top5}, {"ppl", eval.ppl}};
  }
  // The metrics window's losses averaged over the ranks, so that a resumed run logs what an
  // uninterrupted one does.
  if (parts_.group) parts_.group->all_reduce({state_.window_loss}, distributed::Reduce::avg);
  // Rank 0 writes (every rank holds the same state; sharded, each rank its shard file first); the
  // others learn how it went.
  enum Status : int64_t { kSaved, kFailedGoOn, kFailedStop };
  int64_t status = kSaved;
  std::string msg;
  std::string shard_error;
  const auto start = std::chrono::steady_clock::now();
  const nlohmann::json shards = parts_.fsdp ? write_shards(shard_error) : nlohmann::json();
  if (job_.rank == 0) {
    try {
      if (!shard_error.empty()) throw std::runtime_error(shard_error);
      checkpoint::State state = snapshot();
      if (parts_.fsdp) state.meta["shards"] = shards;
      last_ = dir_->save(state_.step, state, metrics);
      struct stat st;
      double mb = ::stat(last_.c_str(), &st) == 0 ? st.st_size / 1e6 : 0.0;
      for (const auto& shard : shards) mb += shard.value("bytes", uint64_t{0}) / 1e6;
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      log::info(
          strprintf("checkpoint %s (%.1f MB%s in %.3f s)", last_.c_str(), mb,
                    shards.empty() ? "" : strprintf(" with %zu shards", shards.size()).c_str(),
                    took.count()));
    } catch (const std::exception& e) {
      msg = "checkpoint at step " + std::to_string(state_.step) + " not saved: " + e.what() +
            (last_.empty() ? "; no earlier checkpoint of this run exists"
                           : "; the previous checkpoint " + last_ + " is intact");
      status = loaded_.cfg.run.continue_on_save_error ? kFailedGoOn : kFailedStop;
    }
  }
  if (parts_.group) {
    auto agreed =
        torch::full({1}, status, torch::TensorOptions(torch::kLong).device(parts_.group->device()));
    parts_.group->broadcast({agreed}, /*root=*/0);
    status = host_int(agreed);
  }
  if (status == kFailedStop) {
    throw std::runtime_error(job_.rank == 0
                                 ? msg + " (run.continue_on_save_error: true trains on)"
                                 : "rank 0 could not save the checkpoint of step " +
                                       std::to_string(state_.step) + "; stopping with it");
  }
  if (status == kFailedGoOn && job_.rank == 0) log::error(msg);
}

}  // namespace trainer::engine
