// Checkpointer's rollbacks (train.rollback_on_nan): back to a checkpoint of the run directory
// after a bad step, each checkpoint at most once, further back each time a checkpoint led to a
// failure again.
#include <torch/torch.h>

#include <string>

#include "engine/persist/checkpointer.h"
#include "engine/setup/objective.h"

namespace trainer::engine {

std::string Checkpointer::rollback_target() {
  std::string path;
  if (job_.rank == 0) {
    // The newest checkpoint no rollback went back to (entries() lists them oldest first).
    const auto entries = dir_->entries();
    for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
      if (it->step <= state_.step && !rolled_back_to_.count(it->step)) {
        path = dir_->path() + "/" + it->file;
        break;
      }
    }
  }
  return parts_.group ? parts_.group->broadcast_text(path, /*root=*/0) : path;
}

int64_t Checkpointer::rollback() {
  wait();
  const std::string path = rollback_target();
  if (path.empty()) return -1;
  const TrainingState now = state_;
  const int64_t resumed = resumed_step_;
  restore(checkpoint::load(path), path);
  resumed_step_ = resumed;
  const TrainingState then = state_;
  rolled_back_to_.insert(then.step);
  // The model's history: the steps since the run's start that no rollback undid. Those after the
  // checkpoint's are undone now, each counted once however often the run went back.
  const int64_t history_now = now.step - now.rolled_back_steps;
  const int64_t history_then = then.step - then.rolled_back_steps;
  const int64_t undone = history_now - history_then;
  state_ = now;  // the position, the counters of the run's history
  state_.skipped_steps = now.step - then.updates();  // the schedule's clock is the checkpoint's
  state_.rollbacks = now.rollbacks + 1;
  state_.rolled_back_steps = now.rolled_back_steps + undone;
  state_.bad_steps_in_row = 0;
  // The metrics windows start afresh, the checkpoint's (restored above) as well: the steps in them
  // were undone, and the next record covers the steps from here on, its loss and its
  // train.objective metrics alike.
  state_.window_steps = state_.window_samples = 0;
  state_.window_loss.zero_();
  if (state_.window_grad_norm.defined()) state_.window_grad_norm.zero_();
  if (parts_.objective) parts_.objective->take_window();
  lost_steps_ += undone;
  return then.step;
}

}  // namespace trainer::engine
