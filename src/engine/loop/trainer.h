// The training engine: builds a run's parts from a validated config (engine/setup/components.h),
// then trains, evaluating, logging and checkpointing as configured.
//
// The parts, each with one job: components (what the run trains with), batches (the step
// iterator), step (one optimizer step), evaluator, checkpointer, metrics (records, log lines,
// progress) and probes (FLOPs and memory for doctor and bench). See docs/architecture.md.
#pragma once

#include <torch/nn/module.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/loader.h"
#include "distributed/comm_bytes.h"
#include "distributed/env.h"
#include "engine/loop/evaluator.h"
#include "engine/loop/step.h"
#include "engine/measure/memory.h"
#include "engine/persist/checkpointer.h"

namespace trainer::engine {

// What this rank holds of the training state between steps, in bytes: the parameters, their
// gradients and the optimizer's state (with dist.strategy fsdp, its shards of them).
struct HeldState {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
  int64_t quantized = 0;  // the quantized base's linear weights (model.lora.base_quant)
  int64_t total() const { return params + grads + optimizer + quantized; }
};

// What fit() did.
struct FitResult {
  int64_t steps = 0;            // optimizer steps taken, counted from the start of the run
  int64_t first_step = 0;       // the step this process started from (a resumed run's step)
  bool stopped = false;         // ended early (stop flag or train.stop_at_step), after a checkpoint
  bool reached_target = false;  // ended when an evaluation reached train.stop_at(_top1)'s target
  double target_seconds = 0.0;  // reached_target: wall time from this process's first step
  double target_seconds_from_start = 0.0;  // and from the process's start
  EvalResult last_eval;                    // the last evaluation (samples == 0 when none ran)
  double seconds = 0.0;  // wall time of the loop (this process's steps from first_step)
  // Host reads (synchronisations with the device) per step made inside the steps, and in all
  // outside them (logging, evaluation, checkpoints); ATen operators per step, counted over a
  // few steps after the first (0 when the run had too few).
  double host_reads_per_step = 0.0;
  int64_t host_reads_outside_steps = 0;
  double ops_per_step = 0.0;
};

class Trainer {
 public:
  // Builds the run's components (engine/setup/components.h). A launched `job`
  // (distributed::DistEnv::launched) trains data-parallel over a process group with every other
  // rank: each rank its shard of the data, gradients averaged, metrics averaged, only rank 0
  // writing the run dir. Throws config::ConfigError for settings the model or data reject,
  // data::DataError for unreadable data, distributed::GroupError when the ranks cannot form their
  // group. Every rank of a job must construct its Trainer, in the same order.
  // Build::plan builds the run's plan instead (components.h): nothing it allocates depends on the
  // model's size; summary(), estimate_memory() and measure_step_memory() work on it, training
  // and using it do not.
  explicit Trainer(const config::LoadedConfig& loaded, const distributed::DistEnv& job = {},
                   Build build = Build::train);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Device, data sizes, steps and the model summary (with its `parameters: N` line).
  std::string summary() const;

  // What the config under-delivers (engine::warmup_warning), one line each, to say before
  // training (and in --dry-run).
  std::vector<std::string> config_warnings() const;

  // Continues from a checkpoint (Checkpointer::resume); config::ConfigError when
  // train.stop_at_step lies before the step resumed from. Every rank must call this, in the same
  // order.
  bool resume(const std::string& spec);

  // Loads the model weights of a checkpoint file for evaluation or prediction
  // (Checkpointer::load_model, which checks the data's classes when `labels` says they are used;
  // `weights`: the trained ones or train.ema's average) and returns its step. Every rank must
  // call this.
  int64_t load_model(const std::string& path, LabelUse labels = LabelUse::train_and_score,
                     const checkpoint::State* loaded = nullptr,
                     WeightsUse weights = WeightsUse::trained);
  // Whether load_model() gave the checkpoint's train.ema average of the weights (else the trained
  // ones).
  bool loaded_average() const;

  // Trains to the end (or until *stop becomes true, or train.stop_at_step), evaluating, logging
  // and checkpointing as configured; a stop writes a checkpoint first. Writes
  // <run.dir>/metrics.jsonl (after a resume: keeps its lines up to the checkpoint's step and
  // appends); the run dir must exist. Every rank must call this, in the same order.
  FitResult fit(const std::atomic<bool>* stop = nullptr);

  // Runs `steps` training steps, epochs rolling over, without evaluation, checkpoints or metrics,
  // telling `observer` where each step and phase begins. With `fixed_batch` every step trains on
  // the first step's batches, kept on the device: the step's speed without the loader.
  void run_steps(int64_t steps, StepObserver& observer, bool fixed_batch = false);

  // Draws at least `steps` steps' batches, and for at least `min_seconds`, from the training
  // loader without training (epochs rolling over): this process's samples per second of the
  // input pipeline alone.
  double input_samples_per_sec(int64_t steps, double min_seconds);

  // The floating-point operations of one forward pass over one training batch
  // (engine/measure/flops.h), under autocast when amp.enabled.
  int64_t forward_flops();
  // The model FLOPs of a training step over one training batch (engine/use/probes.h's
  // train_step_flops: frozen weights cost no weight gradient). Every rank must call this, in the
  // same order.
  int64_t train_flops();

  // The newest checkpoint written or resumed from; "" when none.
  std::string last_checkpoint() const;

  // Measures the memory of a training step (engine/use/probes.h) on the CPU, in float32 or under
  // bfloat16 autocast; the model must be on the CPU. A `checkpointing` setting other than ""
  // measures the model built with that model.checkpointing instead; a `base_quant` other than ""
  // counts the base as model.lora.base_quant would hold it (a planned model's).
  MemoryEstimate estimate_memory(bool bf16, const std::string& checkpointing = "",
                                 const std::string& base_quant = "");

  // The measured CPU peak of one forward/backward at `batch` samples (float32 or bfloat16
  // autocast), without parameters and optimizer state: what estimate_memory extrapolates.
  int64_t measure_step_memory(bool bf16, int64_t batch);

  // Evaluates the current model on the validation split (engine/loop/evaluator.h).
  EvalResult evaluate();
  // The same on the training split: its samples as training draws them (with its augmentation),
  // in order, each once over the ranks.
  EvalResult evaluate_train_split();

  // The model being trained.
  torch::nn::Module& model();

  // This process's rank in the job (0 when training alone): only rank 0 writes the run dir.
  int rank() const;
  // The processes training together (1 when alone).
  int world_size() const;
  // The model's replicas, each reading its own batches: world_size() / dist.tp_size.
  int data_parallel_size() const;
  // A decoder over the model (models::Decoder; with a key/value cache when `use_cache`), in eval
  // mode; nullptr when the model is not a language model.
  std::unique_ptr<models::Decoder> decoder(bool use_cache);

  // The model input [C, H, W] for an image file, as the validation split transforms its samples
  // (data::Dataset::input_from_image); throws data::DataError.
  torch::Tensor input_from_image(const std::vector<uint8_t>& bytes, const std::string& path) const;
  // The class names by label: a loaded checkpoint's where it saved them, else the data set's;
  // empty where neither has any.
  const std::vector<std::string>& class_names() const;
  // Class probabilities [B, K] of `inputs` [B, ...] on the CPU: the model in eval mode, under
  // the config's autocast. Synchronises the device.
  torch::Tensor predict(const torch::Tensor& inputs);

  // Optimizer steps taken (or resumed from).
  int64_t step() const;
  // The training state this rank holds now. Synchronises the device (reads the optimizer state).
  HeldState held_state() const;
  // What this rank's collectives have moved so far, by kind: with fsdp the (padded) buffers
  // all-gathered and reduce-scattered, with ddp every gradient once per step (all-reduce), and
  // the steps' own (the loss, the flags); nothing alone.
  distributed::CommBytes communicated() const;
  // The device the model trains on.
  torch::Device device() const;
  // The job's process group; nullptr when training alone.
  distributed::Group* group() const;
  // The validated config the trainer was built from.
  const config::Config& config() const;
  // Tokens per sample for language models (the sequence length); 0 for other data.
  int64_t tokens_per_sample() const;

  // The engine's parts (trainer.cpp).
  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace trainer::engine
