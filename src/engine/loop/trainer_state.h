// Trainer::State, the engine's parts as one object: shared by trainer.cpp (training) and
// trainer_use.cpp (using a trained model). Internal to the engine.
#pragma once

#include <memory>

#include "engine/loop/graphed_step.h"
#include "engine/loop/preference_step.h"
#include "engine/loop/spike_guard.h"
#include "engine/loop/step.h"
#include "engine/loop/trainer.h"
#include "engine/loop/weight_average.h"
#include "engine/persist/checkpointer.h"
#include "engine/setup/components.h"
#include "engine/setup/state.h"

namespace trainer::engine {

struct Trainer::State {
  State(const config::LoadedConfig& l, const distributed::DistEnv& j, Build build)
      : loaded(l),
        job(j),
        parts(with_objective(build_components(loaded, job, build), loaded.cfg)),
        guard(make_guard(loaded.cfg.train, parts)),
        average(loaded.cfg.train.ema.enabled()
                    ? std::make_unique<WeightAverage>(loaded.cfg.train.ema, parts)
                    : nullptr),
        checkpointer(loaded, parts, state, job, saved_parts()),
        step(make_stepper(parts, loaded.cfg.train, state, guard.get())) {
    state.window_loss = torch::zeros({}, torch::TensorOptions().device(parts.device));
  }

  // train.objective's step (null for supervised) in the parts.
  static Components with_objective(Components parts, const config::Config& cfg) {
    parts.objective = make_objective(cfg, parts.group.get(), parts.model.get());
    return parts;
  }

  static std::unique_ptr<SpikeGuard> make_guard(const config::TrainConfig& train,
                                                const Components& parts) {
    if (!train.skip_update_zscore.enabled()) return nullptr;
    return std::make_unique<SpikeGuard>(train.skip_update_zscore, parts.device);
  }

  // After a step's update was queued (not an abandoned one): its place in the epoch and the
  // weight average, in training and in bench alike.
  void after_step() {
    ++state.step_in_epoch;
    if (average) average->update(state.step);
  }

  // What checkpoints hold besides the model, the optimizer and the counters.
  std::vector<SavedPart*> saved_parts() {
    std::vector<SavedPart*> out;
    if (guard) out.push_back(guard.get());
    if (average) out.push_back(average.get());
    if (auto* part = dynamic_cast<SavedPart*>(parts.objective.get())) out.push_back(part);
    return out;
  }

  // The step that dispatches its operators, or (train.cuda_graph) the one that replays them.
  static std::unique_ptr<Stepper> make_stepper(Components& parts, const config::TrainConfig& train,
                                               TrainingState& state, SpikeGuard* guard) {
    if (!train.cuda_graph) return std::make_unique<TrainStep>(parts, train, state, guard);
    if (parts.world_size() > 1) {
      throw std::runtime_error("train.cuda_graph: a job of " + std::to_string(parts.world_size()) +
                               " processes; a captured step runs in one (DDP's all-reduces are "
                               "not captured), set train.cuda_graph: false");
    }
    // On the CPU (which only the tests reach: the config check refuses it) the captured work is
    // replayed eagerly.
    return std::make_unique<GraphedStep>(
        parts, train, state, parts.device.is_cuda() ? cuda_graph(parts.device) : eager_graph(),
        /*warmup=*/3, guard);
  }

  const config::LoadedConfig loaded;  // held by value: the caller's copy may go away first
  const distributed::DistEnv job;     // this process's place in the job
  Components parts;
  TrainingState state;
  std::unique_ptr<SpikeGuard> guard;       // train.skip_update_zscore; null when off
  std::unique_ptr<WeightAverage> average;  // train.ema; null when off
  Checkpointer checkpointer;
  std::unique_ptr<Stepper> step;
};

}  // namespace trainer::engine
