// One optimizer step: the micro-batches' forward and backward passes, the decision to apply or
// skip the update (agreed by every rank), unscaling, clipping and the update.
#pragma once

#include <torch/types.h>

#include <optional>
#include <vector>

#include "config/config.h"
#include "data/dataset.h"
#include "distributed/process_group.h"
#include "engine/components.h"
#include "engine/state.h"

namespace trainer::engine {

// The phases of a training step, in order (micro-batches repeat forward and backward).
enum class Phase {
  data,       // waiting for the step's batches from the loader
  forward,    // host-to-device copy, forward pass and loss
  backward,   // backward pass (with DDP: gradient all-reduces overlapping it)
  grad_sync,  // waiting for DDP's last all-reduces after backward
  optimizer,  // inf/NaN decision, unscale, clipping, optimizer step
};
constexpr int kPhaseCount = 5;

// Told where each step and each of its phases begins: `trainer bench`'s timers and counters. The
// base class ignores everything.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // A step begins with Phase::data.
  virtual void begin_step() {}
  // `phase` of the current step begins now, ending the phase before it.
  virtual void begin(Phase /*phase*/) {}
  // The step's work is queued; `loss` is its mean loss, a device scalar.
  virtual void end_step(const torch::Tensor& /*loss*/) {}
};

// What one training step did; the same on every rank.
struct StepOutcome {
  torch::Tensor loss;     // mean loss over the micro-batches, a device scalar (this rank's)
  bool skipped = false;   // the update was not applied (inf/NaN gradients or loss)
  bool bad_loss = false;  // the loss was inf or NaN (on some rank)
  bool stop = false;      // some rank was asked to stop
};

// The flags a step decides by, read to the host once per step: the loss (inf/NaN: skip) and
// whether this rank was asked to stop, summed over a group while the last backward runs, and the
// gradient scaler's found_inf.
class StepFlags {
 public:
  // In a group of more than one, starts the all-reduce of this rank's [loss, stop] flags
  // (`group` null: alone, nothing to agree). Every rank must call this, in the same order.
  void start(const torch::Tensor& loss, bool stop_requested, distributed::Group* group);

  // Waits for the all-reduce and decides. Reads the flags and `found_inf` (undefined without a
  // scaler) to the host in one copy when there is anything to decide: a group, a scaler or
  // `check_loss` (train.max_bad_steps > 0); this synchronises the device. Otherwise nothing is
  // read and the step counts as good.
  StepOutcome finish(const torch::Tensor& loss, const torch::Tensor& found_inf, bool check_loss);

 private:
  torch::Tensor agreed_;                         // [loss, stop] summed over the ranks
  std::optional<distributed::Pending> pending_;  // its all-reduce
};

// Runs training steps over the components, counting them in a TrainingState.
class Stepper {
 public:
  virtual ~Stepper() = default;

  // One step over `micro_batches`: forward (under autocast) and backward of each, gradients
  // accumulating (with DDP: averaged over the ranks on the last), then the update with this
  // step's learning rate unless a gradient (with a scaler) or the loss is inf/NaN. `observer`
  // (may be null) is told where each phase begins. Every rank of a group must call this, in the
  // same order: it runs DDP's all-reduces and the flags'.
  virtual StepOutcome run(const std::vector<data::Batch>& micro_batches, bool stop_requested,
                          StepObserver* observer) = 0;
};

// The step that dispatches each of its operators (the other: GraphedStep, engine/graphed_step.h).
class TrainStep final : public Stepper {
 public:
  TrainStep(Components& parts, const config::TrainConfig& train, TrainingState& state);

  StepOutcome run(const std::vector<data::Batch>& micro_batches, bool stop_requested,
                  StepObserver* observer) override;

  // Clears the gradients, then forward and backward of each micro-batch; returns the mean loss,
  // a device scalar. Reads nothing to the host (a group's flags are only started).
  torch::Tensor forward_backward(const std::vector<data::Batch>& micro_batches, bool stop_requested,
                                 StepObserver* observer);

 private:
  // Unscale, decide, clip and update.
  StepOutcome update(const torch::Tensor& loss);

  Components& parts_;
  const config::TrainConfig& train_;
  TrainingState& state_;
  StepFlags flags_;
};

}  // namespace trainer::engine
