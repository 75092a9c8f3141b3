#include "engine/loop/batches.h"

namespace trainer::engine {

StepBatches::StepBatches(data::Loader& loader, TrainingState& state, int64_t steps_per_epoch,
                         int64_t micro_batches)
    : loader_(loader),
      state_(state),
      steps_per_epoch_(steps_per_epoch),
      micro_batches_(micro_batches) {}

const std::vector<data::Batch>& StepBatches::next() {
  if (!started_) {
    loader_.start_epoch(state_.epoch, state_.step_in_epoch * micro_batches_);
    started_ = true;
  }
  batches_.clear();
  for (int64_t m = 0; m < micro_batches_; ++m) batches_.push_back(*loader_.next());
  return batches_;
}

void StepBatches::next_epoch() {
  ++state_.epoch;
  state_.step_in_epoch = 0;
  started_ = false;
}

}  // namespace trainer::engine
