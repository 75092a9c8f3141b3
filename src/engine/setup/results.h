// What a training step and an evaluation report, and the observer told of a step's phases: the
// results that the loop produces and that observation (metrics, profiler) and persistence (the
// checkpointer) consume.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

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
  int64_t step = 0;       // the step (TrainingState::step after it)
  torch::Tensor loss;     // mean loss over the micro-batches, a device scalar (this rank's)
  bool skipped = false;   // the update was not applied (inf/NaN gradients or loss, a spike)
  bool bad_loss = false;  // the loss was inf or NaN (on some rank)
  bool stop = false;      // some rank was asked to stop
  bool spike = false;     // train.skip_update_zscore found the loss or gradient norm a spike
  float z_loss = 0.0f;    // their z-scores (0 when not checked or the window is not full)
  float z_grad_norm = 0.0f;
};

// One pass over the validation split. Predictions are samples, or tokens for language models.
struct EvalResult {
  double loss = 0.0;      // mean cross-entropy per prediction (no label smoothing)
  double top1 = 0.0;      // fraction of predictions whose target is the arg-max
  double top5 = 0.0;      // fraction whose target is among the 5 highest logits
  double ppl = 0.0;       // perplexity, exp(loss)
  int64_t samples = 0;    // predictions made
  bool sequence = false;  // a language model: predictions are tokens, ppl is the headline
  // train.objective's metrics over the split (dpo: TRL's names, rewards/chosen, ...; loss is then
  // the objective's and samples its items, the pairs); empty for supervised training.
  std::vector<std::pair<std::string, double>> objective;
};

// Told by an evaluation after each batch how many of this rank's batches are done, of how many.
using EvalProgress = std::function<void(int64_t done, int64_t total)>;

}  // namespace trainer::engine
