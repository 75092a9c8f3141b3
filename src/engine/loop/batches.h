// The batches of each training step, in order: the one step iterator of fit() and bench.
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"
#include "engine/setup/state.h"

namespace trainer::engine {

// Hands out the micro-batches of one optimizer step at a time from where `state` says training
// is (epoch, step_in_epoch), starting the loader's epoch when its first batch is needed. The
// caller advances state.step_in_epoch after each step and calls next_epoch() at an epoch's end.
class StepBatches {
 public:
  StepBatches(data::Loader& loader, TrainingState& state, int64_t steps_per_epoch,
              int64_t micro_batches);

  // Whether the epoch in progress has steps left.
  bool has_step() const { return state_.step_in_epoch < steps_per_epoch_; }

  // The next step's micro-batches (each data.batch_size samples).
  const std::vector<data::Batch>& next();

  // Moves the state to the start of the next epoch.
  void next_epoch();

 private:
  data::Loader& loader_;
  TrainingState& state_;
  int64_t steps_per_epoch_;
  int64_t micro_batches_;
  bool started_ = false;  // the loader is at the state's position in its epoch
  std::vector<data::Batch> batches_;
};

}  // namespace trainer::engine
