// Where training is: what a checkpoint records so that a resumed run continues bit for bit.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace trainer::engine {

// The training position and the metrics window in progress. Each counter is listed once, in
// visit(), which both the checkpoint's save and its restore walk (engine/persist/checkpointer.cpp).
struct TrainingState {
  int64_t step = 0;                // optimizer steps taken, counted from the start of the run
  int64_t epoch = 0;               // the epoch in progress, 0-based
  int64_t step_in_epoch = 0;       // steps of that epoch taken
  int64_t last_eval_step = -1;     // the step of the last evaluation; -1 = none yet
  int64_t window_steps = 0;        // steps summed in window_loss (those with a finite loss)
  int64_t window_samples = 0;      // samples this rank trained on in the window
  int64_t bad_samples = 0;         // unreadable samples replaced so far
  int64_t skipped_steps = 0;       // steps whose update was skipped (inf/NaN gradients or loss)
  int64_t bad_steps_in_row = 0;    // consecutive steps with an inf/NaN loss
  int64_t spike_skips = 0;         // of skipped_steps, those train.skip_update_zscore skipped
  int64_t rollbacks = 0;           // times train.rollback_on_nan went back to a checkpoint
  int64_t rolled_back_steps = 0;   // steps undone by those rollbacks (in skipped_steps too)
  torch::Tensor window_loss;       // the window's summed step losses, a device scalar (saved as a
                                   // tensor, outside visit())
  torch::Tensor window_grad_norm;  // and their gradient norms, when the step computes them

  // Optimizer updates applied so far: the learning-rate schedule's clock.
  int64_t updates() const { return step - skipped_steps; }

  // v(name, field, required): `required` is false for counters that older checkpoints lack (they
  // restore as 0).
  template <class V>
  void visit(V& v) {
    v("step", step, true);
    v("epoch", epoch, true);
    v("step_in_epoch", step_in_epoch, true);
    v("last_eval_step", last_eval_step, true);
    v("window_steps", window_steps, true);
    v("window_samples", window_samples, true);
    v("bad_samples", bad_samples, true);
    v("skipped_steps", skipped_steps, false);
    v("bad_steps_in_row", bad_steps_in_row, false);
    v("spike_skips", spike_skips, false);
    v("rollbacks", rollbacks, false);
    v("rolled_back_steps", rolled_back_steps, false);
  }
};

}  // namespace trainer::engine
