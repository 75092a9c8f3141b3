// The training engine: builds everything a run needs from a validated config, then trains,
// evaluates and writes the run dir's metrics.
#pragma once

#include <torch/nn/module.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"
#include "config/loader.h"
#include "dist/env.h"
#include "engine/memory.h"

namespace trainer::engine {

// One pass over the validation split. Predictions are samples, or tokens for language models.
struct EvalResult {
  double loss = 0.0;      // mean cross-entropy per prediction (no label smoothing)
  double top1 = 0.0;      // fraction of predictions whose target is the arg-max
  double top5 = 0.0;      // fraction whose target is among the 5 highest logits
  double ppl = 0.0;       // perplexity, exp(loss)
  int64_t samples = 0;    // predictions made
  bool sequence = false;  // a language model: predictions are tokens, ppl is the headline
};

// What fit() did.
struct FitResult {
  int64_t steps = 0;            // optimizer steps taken, counted from the start of the run
  bool stopped = false;         // ended early (stop flag or train.stop_at_step), after a checkpoint
  bool reached_target = false;  // ended when an evaluation reached train.stop_at_top1
  EvalResult last_eval;         // the last evaluation (samples == 0 when none ran)
  double seconds = 0.0;         // wall time of the loop
};

// The phases of a training step, in order (micro-batches repeat forward and backward).
enum class Phase {
  data,       // waiting for the step's batches from the loader
  forward,    // host-to-device copy, forward pass and loss
  backward,   // backward pass (with DDP: gradient all-reduces overlapping it)
  grad_sync,  // waiting for DDP's last all-reduces after backward
  optimizer,  // inf/NaN decision, unscale, clipping, optimizer step
};
constexpr int kPhaseCount = 5;

// Told where each step of Trainer::run_steps and each of its phases begins: `trainer bench`'s
// timers.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // A step begins with Phase::data.
  virtual void begin_step() = 0;
  // `phase` of the current step begins now, ending the phase before it.
  virtual void begin(Phase phase) = 0;
  // The step's work is queued; `loss` is its mean loss, a device scalar.
  virtual void end_step(const torch::Tensor& loss) = 0;
};

// The model weights in a checkpoint the trainer wrote, under their state-dict names.
checkpoint::NamedTensors model_weights(const checkpoint::State& ckpt);

class Trainer {
 public:
  // Builds, in order: device, process group, data, model (activation checkpointing inside), DDP,
  // optimizer, schedule, scaler. A launched `job` (dist::DistEnv::launched) trains data-parallel
  // over a process group with every other rank: each rank its shard of the data, gradients
  // averaged, metrics averaged, only rank 0 writing the run dir. Throws config::ConfigError for
  // settings the model or data reject, data::DataError for unreadable data,
  // dist::GroupError when the ranks cannot form their group.
  explicit Trainer(const config::LoadedConfig& loaded, const dist::DistEnv& job = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Device, data sizes, steps and the model summary (with its `parameters: N` line).
  std::string summary() const;

  // Continues from a checkpoint: "auto" takes the newest one of <run.dir>/checkpoints that
  // verifies (returns false, a fresh start, when there is none); anything else is a checkpoint
  // file. Restores the model, optimizer, RNG, data position and metrics window, so the run goes on
  // exactly as if never interrupted. Throws config::ConfigError when the checkpoint belongs to
  // another model or optimizer, checkpoint::CorruptCheckpoint for a damaged file.
  bool resume(const std::string& spec);

  // Trains to the end (or until *stop becomes true, or train.stop_at_step), evaluating, logging
  // and checkpointing as configured; a stop writes a checkpoint first. Writes
  // <run.dir>/metrics.jsonl (after a resume: keeps its lines up to the checkpoint's step and
  // appends); the run dir must exist.
  FitResult fit(const std::atomic<bool>* stop = nullptr);

  // Runs `steps` training steps, epochs rolling over, without evaluation, checkpoints or metrics,
  // telling `observer` where each step and phase begins. With `fixed_batch` every step trains on
  // the first step's batches, kept on the device: the step's speed without the loader.
  void run_steps(int64_t steps, StepObserver& observer, bool fixed_batch = false);

  // The floating-point operations of one forward pass over one training batch (engine/flops.h),
  // under autocast when amp.enabled.
  int64_t forward_flops();

  // The newest checkpoint written or resumed from; "" when none.
  std::string last_checkpoint() const;

  // Measures the memory of a training step (engine/memory.h) on the CPU, in float32 or under
  // bfloat16 autocast; the model must be on the CPU. Leaves the model and optimizer as they were.
  // A `checkpointing` setting other than "" measures the model built with that
  // model.checkpointing instead; throws models::ModelError when the model has no blocks.
  MemoryEstimate estimate_memory(bool bf16, const std::string& checkpointing = "");

  // The measured CPU peak of one forward/backward at `batch` samples (float32 or bfloat16
  // autocast), without parameters and optimizer state: what estimate_memory extrapolates.
  int64_t measure_step_memory(bool bf16, int64_t batch);

  // Evaluates the current model on the validation split.
  EvalResult evaluate();

  // The model being trained.
  torch::nn::Module& model();

  // This process's rank in the job (0 when training alone): only rank 0 writes the run dir.
  int rank() const;
  // The processes training together (1 when alone).
  int world_size() const;
  // The device the model trains on.
  torch::Device device() const;
  // The validated config the trainer was built from.
  const config::Config& config() const;
  // Tokens per sample for language models (the sequence length); 0 for other data.
  int64_t tokens_per_sample() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace trainer::engine
