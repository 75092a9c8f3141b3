// One optimizer step: the micro-batches' forward and backward passes, the decision to apply or
// skip the update (agreed by every rank), unscaling, clipping and the update.
#pragma once

#include <c10/core/Event.h>
#include <torch/types.h>

#include <optional>
#include <vector>

#include "config/config.h"
#include "data/dataset.h"
#include "distributed/process_group.h"
#include "engine/loop/spike_guard.h"
#include "engine/setup/components.h"
#include "engine/setup/results.h"
#include "engine/setup/state.h"

namespace trainer::engine {

// The flags a step decides by: the loss (inf/NaN: skip), whether some rank was asked to stop
// (summed over a group while the last backward runs) and the gradient scaler's found_inf. The
// decision is made on the device, into buffers made at the first step and written in place at
// every other (no allocation, a few operators); the flags reach the host one step late, through a
// copy to pinned memory that nothing waits for when it is queued.
class StepFlags {
 public:
  // In a group of more than one, starts the all-reduce of this rank's [loss, stop] flags
  // (`group` null: alone, nothing to agree). Every rank must call this, in the same order.
  void start(const torch::Tensor& loss, bool stop_requested, distributed::Group* group);

  // Waits for the all-reduce (on the device's stream), then decides on the device: with
  // `skip_bad` (train.max_bad_steps > 0) `bad` is 1 when the loss (of some rank) is inf/NaN, else
  // always 0; `skip` is 1 when `bad` or `found_inf` (undefined without a scaler) is, or when
  // `guard` (may be null) finds the loss (the ranks' mean) or `grad_norm` (undefined: not
  // computed) a spike; float32 scalars (skip: a fused optimizer's found_inf; `bad` itself when
  // nothing else joins it). `kept_loss` and `kept_grad_norm` (undefined without `grad_norm`) are
  // `loss` and `grad_norm` as the metrics window takes them: 0 when `bad`. Nothing waits for the
  // device. The flags stay on the device until queue(); the decision's tensors are this object's
  // buffers, rewritten by the next decide().
  struct Decision {
    torch::Tensor bad, skip;
    torch::Tensor kept_loss, kept_grad_norm;
  };
  Decision decide(const torch::Tensor& loss, const torch::Tensor& found_inf, bool skip_bad,
                  SpikeGuard* guard = nullptr, const torch::Tensor& grad_norm = {});

  // Queues the copy of the decided flags to pinned host memory as step `step`'s, for read().
  // Nothing waits for the device.
  void queue(int64_t step);

  // Whether queue() queued flags that read() has not taken.
  bool pending() const { return pending_step_ >= 0; }

  // The queued step's outcome (its `loss` undefined: the device value may be overwritten since).
  // Waits for the copy queue() queued (an event recorded when the step's work was queued; a step
  // later it has normally passed). Reads pinned host memory, not the device.
  StepOutcome read();

 private:
  // Makes the buffers on `loss`'s device, with the spike guard's slots when `spikes`; once.
  void make_buffers(const torch::Tensor& loss, bool spikes);
  // Writes `bad` from `summed` (the loss, summed over the ranks when agreeing) and the kept loss
  // and gradient norm into `d`.
  void mark_bad(const torch::Tensor& summed, const torch::Tensor& loss,
                const torch::Tensor& grad_norm, Decision& d);

  torch::Tensor agreed_;                        // [loss, stop] summed over the ranks (a group's)
  bool agreeing_ = false;                       // start() began agreed_'s all-reduce
  int world_ = 1;                               // the ranks summed in agreed_
  std::optional<distributed::Pending> reduce_;  // its all-reduce
  // [stop, bad, skip] float32 (with a guard: spike, z_loss, z_grad_norm too); `skip` is written
  // only when found_inf or the guard joins `bad` (else 0: the step skips when `bad`).
  torch::Tensor flags_;
  torch::Tensor kept_;      // [loss, grad_norm, 0] float32: the window's values, where()'s zero
  torch::Tensor bad_mask_;  // [] bool: `bad` as a condition
  struct Slots {            // views of the buffers, made with them
    torch::Tensor summed, stop_sum;  // agreed_'s
    torch::Tensor stop, bad, skip, spike, z;
    torch::Tensor kept_loss, kept_grad_norm, zero;
  } at_;
  torch::Tensor host_;                // the flags' copy (pinned memory with a GPU)
  std::optional<c10::Event> copied_;  // recorded after the copy (a GPU)
  int64_t pending_step_ = -1;         // the queued step not yet read; -1: none
};

// What the run learns of its steps, in order, as their flags reach the host.
struct Settled {
  std::vector<StepOutcome> outcomes;  // the steps whose flags arrived, oldest first
  bool abandoned = false;  // the step just queued was dropped without its update: an earlier
                           // step's outcome ends the run (a stop, train.max_bad_steps)
};

// Runs training steps over the components, counting them in a TrainingState.
class Stepper {
 public:
  virtual ~Stepper() = default;

  // Queues one step over `micro_batches`: forward (under autocast) and backward of each,
  // gradients accumulating (with DDP: averaged over the ranks on the last), then the update with
  // this step's learning rate, which the device skips when a gradient (with a scaler) or the
  // loss is inf/NaN. Returns the outcomes that reached the host meanwhile: the previous step's,
  // taken after this step's forward and backward are queued and before its update, so that the
  // device never waits for the host. When that outcome ends the run (the ranks agreed to stop,
  // or TrainingState::bad_steps_in_row reaches train.max_bad_steps), this step's update is not
  // queued and it is not counted (`abandoned`). `observer` (may be null) is told where each
  // phase begins. Every rank of a group must call this, in the same order: it runs DDP's
  // all-reduces and the flags'.
  virtual Settled run(const std::vector<data::Batch>& micro_batches, bool stop_requested,
                      StepObserver* observer) = 0;

  // The outcomes of the steps queued and not yet returned; waits for their flags' copy.
  virtual std::vector<StepOutcome> settle() = 0;

  // The mean loss of the step queued last (a device scalar).
  virtual const torch::Tensor& last_loss() const = 0;
};

// Whether a step computes the gradients' global norm: for train.clip_grad_norm, or for `guard`
// (may be null) checking it. The gradients must then be unscaled before it.
bool computes_grad_norm(const config::TrainConfig& train, const SpikeGuard* guard);

// The gradients' global norm when a step needs it (computes_grad_norm), over every rank's shard
// with fsdp (every rank must call this, in the same order); else
// undefined. Nothing waits for the device.
torch::Tensor step_grad_norm(Components& parts, const config::TrainConfig& train,
                             const SpikeGuard* guard);

// Adds a step's loss and gradient norm (when defined) as StepFlags::decide() kept them (0 on a
// bad step) to the metrics window in `state`: device work only, one operator.
void add_to_window(TrainingState& state, const StepFlags::Decision& decision);

// Counts an outcome in `state` (skipped steps, bad steps in a row) as it reaches the host.
void count_outcome(const StepOutcome& outcome, TrainingState& state);

// Whether `outcome`, counted in `state`, ends the run: the ranks agreed to stop, or the losses
// were inf/NaN in train.max_bad_steps steps in a row.
bool ends_run(const StepOutcome& outcome, const TrainingState& state,
              const config::TrainConfig& train);

// The step that dispatches each of its operators (the other: GraphedStep,
// engine/loop/graphed_step.h).
class TrainStep final : public Stepper {
 public:
  // `guard`: train.skip_update_zscore's, or null.
  TrainStep(Components& parts, const config::TrainConfig& train, TrainingState& state,
            SpikeGuard* guard = nullptr);

  Settled run(const std::vector<data::Batch>& micro_batches, bool stop_requested,
              StepObserver* observer) override;
  std::vector<StepOutcome> settle() override;
  const torch::Tensor& last_loss() const override { return loss_; }

  // Clears the gradients, then forward and backward of each micro-batch; returns the mean loss,
  // a device scalar. A language model's (targets [B, T]) is the mean over the trained tokens of
  // the whole step: each token's loss over their count on every data-parallel rank (counted on
  // the host, summed by one all-reduce over the data-parallel group) times the ranks, which DDP
  // and fsdp average. Reads nothing to the host (a group's flags are only started). Every rank of
  // a group must call this, in the same order.
  torch::Tensor forward_backward(const std::vector<data::Batch>& micro_batches, bool stop_requested,
                                 StepObserver* observer);

 private:
  // Unscale, decide, clip and update; the device skips the update on a bad step (an optimizer
  // that cannot: the flags are read at once, a host read).
  void update(const torch::Tensor& loss);

  Components& parts_;
  const config::TrainConfig& train_;
  TrainingState& state_;
  SpikeGuard* guard_;
  StepFlags flags_;
  torch::Tensor loss_;
  std::optional<StepOutcome> ready_;  // read at once (an optimizer that cannot skip on the device)
};

}  // namespace trainer::engine
