// Trainer::State, the engine's parts as one object: shared by trainer.cpp (training) and
// trainer_use.cpp (using a trained model). Internal to the engine.
#pragma once

#include <memory>

#include "engine/loop/checkpointer.h"
#include "engine/loop/components.h"
#include "engine/loop/graphed_step.h"
#include "engine/loop/state.h"
#include "engine/loop/step.h"
#include "engine/loop/trainer.h"

namespace trainer::engine {

struct Trainer::State {
  State(const config::LoadedConfig& l, const distributed::DistEnv& j)
      : loaded(l),
        job(j),
        parts(build_components(loaded, job)),
        checkpointer(loaded, parts, state, job),
        step(make_stepper(parts, loaded.cfg.train, state)) {
    state.window_loss = torch::zeros({}, torch::TensorOptions().device(parts.device));
  }

  // The step that dispatches its operators, or (train.cuda_graph) the one that replays them.
  static std::unique_ptr<Stepper> make_stepper(Components& parts, const config::TrainConfig& train,
                                               TrainingState& state) {
    if (!train.cuda_graph) return std::make_unique<TrainStep>(parts, train, state);
    if (parts.world_size() > 1) {
      throw std::runtime_error("train.cuda_graph: a job of " + std::to_string(parts.world_size()) +
                               " processes; a captured step runs in one (DDP's all-reduces are "
                               "not captured), set train.cuda_graph: false");
    }
    // On the CPU (which only the tests reach: the config check refuses it) the captured work is
    // replayed eagerly.
    return std::make_unique<GraphedStep>(
        parts, train, state, parts.device.is_cuda() ? cuda_graph(parts.device) : eager_graph());
  }

  const config::LoadedConfig loaded;  // held by value: the caller's copy may go away first
  const distributed::DistEnv job;     // this process's place in the job
  Components parts;
  TrainingState state;
  Checkpointer checkpointer;
  std::unique_ptr<Stepper> step;
};

}  // namespace trainer::engine
