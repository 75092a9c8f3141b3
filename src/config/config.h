// The run configuration: plain structs mirroring the YAML sections.
//
// Every field has a default. Each struct lists its fields once, in `visit`, which is what the
// loader, the emitter, `--set` and the "did you mean" suggestions walk. The keys of one model,
// data set or optimizer live in that entry's own file (config/options.h); a section holds every
// entry's in `options`, visited as `v("", options)` after the section's own fields. This header
// and the config library never include torch.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "config/options.h"

namespace trainer::config {

struct RunConfig {
  std::string dir;               // run directory; empty = runs/<config file stem>
  int64_t log_every = 10;        // optimizer steps between train metric lines
  int64_t eval_every = 0;        // optimizer steps between evaluations; 0 = end of each epoch
  int64_t eval_batches = 0;      // batches per rank an evaluation in training reads; 0 = all
  int64_t checkpoint_every = 0;  // optimizer steps between checkpoints; 0 = end of each epoch
  int64_t keep_last = 3;         // training checkpoints kept
  std::string keep_best;  // also keep the best checkpoint by this val metric: top1|top5|loss|ppl
  bool continue_on_save_error = false;  // a failed checkpoint save: log and train on (else exit 1)
  bool checkpoint_async = false;  // copy the state to host memory, write it on a background thread
  int64_t threads = 0;            // intra-op CPU threads; 0 = LibTorch's default
  std::string progress = "auto";  // progress bar: auto (when stderr is a terminal)|always|never
  bool tensorboard = true;        // also write the metrics as TensorBoard events to <dir>/tb/
  bool overwrite = false;  // a fresh run into a used dir moves its contents aside (else refused)
  bool flush_denormal = true;  // CPU: denormal floats flushed to zero (FTZ/DAZ), no slow paths

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("dir", dir);
    v("log_every", log_every);
    v("eval_every", eval_every);
    v("eval_batches", eval_batches);
    v("checkpoint_every", checkpoint_every);
    v("keep_last", keep_last);
    v("keep_best", keep_best);
    v("continue_on_save_error", continue_on_save_error);
    v("checkpoint_async", checkpoint_async);
    v("threads", threads);
    v("progress", progress);
    v("tensorboard", tensorboard);
    v("overwrite", overwrite);
    v("flush_denormal", flush_denormal);
  }
};

// LoRA adapters on a frozen base (nn/lora.h), with PEFT's semantics: y = base(x) +
// B(A(dropout(x))) * scaling, A [rank, in] kaiming-uniform, B [out, rank] zeros, scaling
// alpha / rank (alpha / sqrt(rank) with rslora). Only the adapters train.
struct LoraConfig {
  int64_t rank = 0;                    // the adapters' rank r; 0 = no LoRA (the whole model trains)
  double alpha = 8.0;                  // scaling numerator (PEFT's lora_alpha)
  double dropout = 0.0;                // dropout on the adapters' input while training
  std::vector<std::string> targets;    // linear layers adapted, by their module name's last part
                                       // (q_proj, v_proj, c_attn, ...); empty = PEFT's default for
                                       // the model (q_proj and v_proj; gpt: c_attn)
  bool rslora = false;                 // rank-stabilised scaling alpha / sqrt(rank)
  std::string base_dtype = "float32";  // the frozen base's dtype: float32|bfloat16|float16
  std::string base_quant = "none";     // the base's linear layers held quantized: none|nf4|int8
                                       // (QLoRA; bitsandbytes' 4-bit NF4 or 8-bit rows)

  bool enabled() const { return rank > 0; }

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("rank", rank);
    v("alpha", alpha);
    v("dropout", dropout);
    v("targets", targets);
    v("rslora", rslora);
    v("base_dtype", base_dtype);
    v("base_quant", base_quant);
  }
};

struct ModelConfig {
  std::string name = "mlp";            // model registry name
  int64_t num_classes = 0;             // output classes; 0 = the dataset's class count
  std::string checkpointing = "none";  // activation checkpointing: none|blocks|every:N
  std::string pretrained;              // safetensors file to initialise from; empty = none
  bool pretrained_skip_head =
      false;        // re-initialise a classifier whose shape differs (fine-tuning)
  LoraConfig lora;  // low-rank adapters on a frozen base; off unless lora.rank > 0
  Entries options;  // each model's own keys (model.hidden, model.n_layer, ...), in its file

  // The options of the selected model, as that model's struct.
  template <class T>
  const T& own() const {
    return options.get<T>(name);
  }

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("name", name);
    v("num_classes", num_classes);
    v("checkpointing", checkpointing);
    v("pretrained", pretrained);
    v("pretrained_skip_head", pretrained_skip_head);
    v("lora", lora);
    v("", options);
  }
};

// The `model.checkpointing` setting as a block period: 0 for none, 1 for blocks (every block), N
// for every:N (every N-th block); nullopt when the setting is malformed.
std::optional<int64_t> checkpoint_period(const std::string& spec);

// A list of sections in YAML: a sequence of mappings, each read into an S that starts as
// `prototype` (the defaults, registered entries' keys included). S has a `name` naming the entry
// whose keys config.yaml writes for it.
template <class S>
struct SectionList {
  std::vector<S> items;
  S prototype;
};

// The keys that say which data set a data section reads and how: what a part of data.mix has
// too.
struct DataSetKeys {
  std::string name = "synthetic";  // dataset registry name
  std::string root;                // dataset location; empty = the dataset's default
  bool normalize = true;           // scale inputs to zero mean and unit variance
  std::string on_error = "skip";   // an unreadable sample: skip (warn, count, substitute) or fail
  std::vector<double> mean;        // per-channel normalisation mean; empty = the dataset's own
  std::vector<double> stdev;       // (key `std`) per-channel normalisation std; empty = dataset's
  Entries options;  // each data set's own keys (data.shape, data.seq_len, ...), in its file

  // The options of the selected data set, as that data set's struct.
  template <class T>
  const T& own() const {
    return options.get<T>(name);
  }

  // Range checks of these keys (config.cpp).
  void validate(Checks& checks) const;
};

// One data set of data.mix: its keys, and its share of the samples.
struct MixPart : DataSetKeys {
  double weight = 1.0;  // share of each epoch's samples, relative to the other parts' weights

  MixPart() { name.clear(); }
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("name", name);
    v("root", root);
    v("weight", weight);
    v("normalize", normalize);
    v("on_error", on_error);
    v("mean", mean);
    v("std", stdev);
    v("", options);
  }
};

struct DataConfig : DataSetKeys {
  int64_t batch_size = 128;     // samples per step and process
  int64_t eval_batch_size = 0;  // samples per evaluation batch; 0 = batch_size
  int64_t workers = 2;          // loader threads preparing batches ahead
  int64_t prefetch = 2;         // batches each worker prepares ahead
  int64_t throttle_ms = 0;      // each batch waits this long more (simulates slow input)
  bool shuffle = true;          // reshuffle the training set every epoch
  bool drop_last = true;        // drop the last incomplete training batch
  bool remap_classes = false;   // a checkpoint's classes in another order than the data's are
                                // matched by name (else that is an error)
  SectionList<MixPart> mix;     // the data sets that name `mix` draws from

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("name", name);
    v("root", root);
    v("batch_size", batch_size);
    v("eval_batch_size", eval_batch_size);
    v("workers", workers);
    v("prefetch", prefetch);
    v("throttle_ms", throttle_ms);
    v("shuffle", shuffle);
    v("drop_last", drop_last);
    v("normalize", normalize);
    v("on_error", on_error);
    v("remap_classes", remap_classes);
    v("mean", mean);
    v("std", stdev);
    v("mix", mix);
    v("", options);
  }
};

// An exponential moving average of the trained weights (engine/loop/weight_average.h), with
// timm's ModelEmaV3 semantics: parameters averaged, buffers taken from the model.
struct EmaConfig {
  double decay = 0.0;   // the average's decay per update, e.g. 0.9998; 0 = no average
  bool warmup = false;  // decay warm-up: min(decay, 1 - (1 + n)^(-2/3)) at the n-th update after
                        // the first
  int64_t every = 1;    // update the average every this many optimizer steps

  bool enabled() const { return decay > 0.0; }

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("decay", decay);
    v("warmup", warmup);
    v("every", every);
  }
};

// llm.c's loss-spike guard (engine/loop/spike_guard.h): skip an update whose loss or gradient
// norm lies this many standard deviations above the mean of the previous `window` steps'.
struct ZScoreConfig {
  double loss = 0.0;       // z-score limit of the step's loss; 0 = not checked
  double grad_norm = 0.0;  // z-score limit of the gradients' global norm; 0 = not checked
  int64_t window = 100;    // steps in the running mean and standard deviation

  bool enabled() const { return loss > 0.0 || grad_norm > 0.0; }

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("loss", loss);
    v("grad_norm", grad_norm);
    v("window", window);
  }
};

// train.stop_at: end the run after the first evaluation whose metric reaches a target (MLPerf's
// time to a validation loss), with a checkpoint. One of `below` and `above` is set.
struct StopAtConfig {
  std::string metric;  // an evaluation's metric as the metrics log names it: val/loss, val/ppl,
                       // val/top1, val/top5 (val_ema/... with train.ema); "" = off
  double below = std::numeric_limits<double>::quiet_NaN();  // reached at metric <= below
  double above = std::numeric_limits<double>::quiet_NaN();  // reached at metric >= above

  bool enabled() const { return !metric.empty(); }

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("metric", metric);
    v("below", below);
    v("above", above);
  }
};

struct TrainConfig {
  int64_t epochs = 1;            // passes over the training set
  int64_t max_steps = 0;         // >0: stop after this many optimizer steps (overrides epochs)
  int64_t stop_at_step = 0;      // >0: end this process after that step, with a checkpoint, as if
                                 // preempted; the schedule still spans the whole run
  double stop_at_top1 = 0.0;     // >0: end the run after the first evaluation whose top-1
                                 // reaches this fraction (time-to-accuracy), with a checkpoint
  StopAtConfig stop_at;          // the same for any evaluation metric and target
  int64_t grad_accum_steps = 1;  // micro-batches per optimizer step
  double clip_grad_norm = 0.0;   // clip gradients to this global L2 norm; 0 = off
  double label_smoothing = 0.0;  // label smoothing of the classification loss
  std::string loss = "cross_entropy";    // loss registry name
  std::string objective = "supervised";  // supervised (train.loss on the targets) or dpo (pairs
                                         // of completions, the `dpo:` section's loss)
  bool eval_at_end = true;               // evaluate after the last step when it was not just done
  int64_t max_bad_steps = 20;  // skip steps whose loss is inf/NaN; stop after this many in a row
                               // (0 = no per-step check: a bad loss stops the run when logged)
  bool cuda_graph = false;     // capture the step in a CUDA graph after 3 eager steps and replay
                               // it (one GPU process, batches of one shape, fused optimizer)
  EmaConfig ema;               // an average of the weights, evaluated beside them
  ZScoreConfig skip_update_zscore;  // skip the updates of loss or gradient-norm spikes
  bool rollback_on_nan = false;     // an inf/NaN loss reloads the last checkpoint and goes on
                                    // after the bad step's data
  int64_t max_rollbacks = 5;        // rollback_on_nan: the rollbacks a run may make; one more
                                    // ends it (exit 1)

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("epochs", epochs);
    v("max_steps", max_steps);
    v("stop_at_step", stop_at_step);
    v("stop_at_top1", stop_at_top1);
    v("stop_at", stop_at);
    v("grad_accum_steps", grad_accum_steps);
    v("clip_grad_norm", clip_grad_norm);
    v("label_smoothing", label_smoothing);
    v("loss", loss);
    v("objective", objective);
    v("eval_at_end", eval_at_end);
    v("max_bad_steps", max_bad_steps);
    v("cuda_graph", cuda_graph);
    v("ema", ema);
    v("skip_update_zscore", skip_update_zscore);
    v("rollback_on_nan", rollback_on_nan);
    v("max_rollbacks", max_rollbacks);
  }
};

struct OptimConfig {
  std::string name = "sgd";          // optimizer registry name: sgd|adam|adamw
  double lr = 0.1;                   // peak learning rate
  double weight_decay = 0.0;         // L2 (sgd, adam) or decoupled (adamw) weight decay
  bool decay_bias_and_norm = false;  // also decay biases and norm weights (1-D parameters)
  std::string impl = "auto";         // auto (fused)|fused|foreach|loop: the same update, in one
                                     // kernel, a few multi-tensor ops, or per parameter
  Entries options;  // each optimizer's own keys (optim.momentum, optim.betas, ...), in its file

  // The options of the selected optimizer, as that optimizer's struct.
  template <class T>
  const T& own() const {
    return options.get<T>(name);
  }

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("name", name);
    v("lr", lr);
    v("weight_decay", weight_decay);
    v("decay_bias_and_norm", decay_bias_and_norm);
    v("impl", impl);
    v("", options);
  }
};

struct SchedConfig {
  std::string name = "constant";  // scheduler registry name: constant|step|multistep|cosine|linear
  int64_t warmup_steps = 0;       // linear warmup length in optimizer steps
  double warmup_epochs = 0.0;     // warmup length in epochs instead (> 0 overrides warmup_steps)
  double warmup_start_factor = 0.0;  // warmup starts at lr * this factor
  int64_t step_size = 1000;          // step: steps after warmup between decays
  std::vector<int64_t> milestones;   // multistep: steps after warmup at which lr decays
  double gamma = 0.1;                // step, multistep: decay factor
  double min_lr = 0.0;               // cosine, linear: final learning rate

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("name", name);
    v("warmup_steps", warmup_steps);
    v("warmup_epochs", warmup_epochs);
    v("warmup_start_factor", warmup_start_factor);
    v("step_size", step_size);
    v("milestones", milestones);
    v("gamma", gamma);
    v("min_lr", min_lr);
  }
};

struct AmpConfig {
  bool enabled = false;            // mixed precision: autocast around forward and loss
  std::string dtype = "bfloat16";  // float16|bfloat16 (CPU: bfloat16)
  std::string scaler = "auto";     // gradient scaling: auto (float16 only)|on|off
  double init_scale = 65536.0;     // scaler: first loss scale
  double growth_factor = 2.0;      // scaler: scale multiplier after growth_interval clean steps
  double backoff_factor = 0.5;     // scaler: scale multiplier after a step with inf/NaN gradients
  int64_t growth_interval = 2000;  // scaler: clean steps between scale growths

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("enabled", enabled);
    v("dtype", dtype);
    v("scaler", scaler);
    v("init_scale", init_scale);
    v("growth_factor", growth_factor);
    v("backoff_factor", backoff_factor);
    v("growth_interval", growth_interval);
  }
};

struct DistConfig {
  std::string strategy = "ddp";  // ddp (replicated weights)|fsdp (sharded over the ranks)
  int64_t tp_size = 1;  // tensor parallelism: each layer split over groups of this many ranks
  std::string backend = "auto";         // auto|nccl|gloo (auto: nccl on CUDA, gloo on the CPU)
  double bucket_cap_mb = 25.0;          // gradient bucket size in MiB
  double first_bucket_mb = 1.0;         // size of the first bucket, reduced early in backward
  bool find_unused_parameters = false;  // allow parameters that get no gradient in a step
  bool broadcast_buffers = true;        // copy rank 0's buffers (batch-norm statistics) each step
  bool sync_bn = false;                 // batch norm over the global batch (statistics all-reduced)
  bool reducer_at_world_size_1 = false;  // the reducer even in a one-process job (to measure it)
  bool reshard_after_forward = true;     // fsdp: free gathered weights after forward (ZeRO-3)
  std::string fsdp_param_dtype =
      "auto";  // fsdp: gathered weights' dtype: auto (amp.dtype)|float32|bfloat16|float16
  std::string fsdp_reduce_dtype = "float32";  // fsdp: gradients' dtype in the reduce-scatter
  bool fsdp_prefetch = true;                  // fsdp: gather the next block while one computes
  double init_timeout_s = 300.0;              // rendezvous: how long to wait for every rank
  double timeout_s = 600.0;                   // a collective that takes longer ends the run

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("strategy", strategy);
    v("tp_size", tp_size);
    v("backend", backend);
    v("bucket_cap_mb", bucket_cap_mb);
    v("first_bucket_mb", first_bucket_mb);
    v("find_unused_parameters", find_unused_parameters);
    v("broadcast_buffers", broadcast_buffers);
    v("sync_bn", sync_bn);
    v("reducer_at_world_size_1", reducer_at_world_size_1);
    v("reshard_after_forward", reshard_after_forward);
    v("fsdp_param_dtype", fsdp_param_dtype);
    v("fsdp_reduce_dtype", fsdp_reduce_dtype);
    v("fsdp_prefetch", fsdp_prefetch);
    v("init_timeout_s", init_timeout_s);
    v("timeout_s", timeout_s);
  }
};

// An MLflow tracking server the run logs to (tracking/mlflow.h), from rank 0.
struct MlflowConfig {
  std::string uri;                     // http(s)://host:port of `mlflow server`; "" = off
  std::string experiment = "Default";  // the experiment's name; created when missing
  std::string run_name;                // "" = the run dir's name
  std::string tags;                    // the run's own tags: "key=value,key=value"

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  // The tags as (key, value) pairs; `malformed`, when given, gets the first entry that is not
  // key=value (which is left out), if any.
  std::vector<std::pair<std::string, std::string>> tag_list(
      std::optional<std::string>* malformed = nullptr) const;

  template <class V>
  void visit(V& v) {
    v("uri", uri);
    v("experiment", experiment);
    v("run_name", run_name);
    v("tags", tags);
  }
};

// Where the metrics go besides metrics.jsonl and TensorBoard.
struct TrackingConfig {
  bool csv = false;     // also <run.dir>/metrics.csv: the same records as a table
  MlflowConfig mlflow;  // an MLflow tracking server

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("csv", csv);
    v("mlflow", mlflow);
  }
};

// Training steps recorded by LibTorch's Kineto profiler (engine/observe/profile_window.h).
struct ProfileConfig {
  int64_t start_step = 0;            // the first profiled step (1-based); 0 = no profile
  int64_t steps = 5;                 // steps profiled from there
  bool record_shapes = false;        // the operators' input shapes in the trace
  bool with_stack = false;           // call stacks where LibTorch records them
  bool memory = false;               // allocations and frees as [memory] events
  bool memory_snapshot = false;      // record the CUDA caching allocator's history and write
                                     // <run.dir>/memory_snapshot.pickle on out-of-memory
  int64_t memory_snapshot_step = 0;  // also write it after this step; 0 = only on out-of-memory

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("start_step", start_step);
    v("steps", steps);
    v("record_shapes", record_shapes);
    v("with_stack", with_stack);
    v("memory", memory);
    v("memory_snapshot", memory_snapshot);
    v("memory_snapshot_step", memory_snapshot_step);
  }
};

// How `trainer --config` starts: in this process, or as a local job of several.
struct LaunchConfig {
  std::string nproc_per_node = "1";  // processes to train on: N, or auto (one per local GPU; one
                                     // without a GPU, as trainer launch's auto)

  // Range checks of this section's own keys (config.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("nproc_per_node", nproc_per_node);
  }
};

// Preference tuning (train.objective: dpo) on data.name: preference, as TRL 1.16's DPOTrainer
// (sigmoid, ipo, hinge, robust), CPOTrainer (simpo) and ORPOTrainer (orpo) compute it.
struct DpoConfig {
  std::string loss_type = "sigmoid";  // sigmoid|ipo|hinge|robust (against a reference)|simpo|orpo
  double beta = 0.1;                  // β (ORPO's λ)
  double label_smoothing = 0.0;       // robust's ε in [0, 0.5)
  double simpo_gamma = 0.5;           // simpo's margin γ
  double cpo_alpha = 0.0;             // simpo: weight of an NLL term on the chosen completions

  // Range checks of this section's own keys (validate.cpp).
  void validate(Checks& checks) const;

  template <class V>
  void visit(V& v) {
    v("loss_type", loss_type);
    v("beta", beta);
    v("label_smoothing", label_smoothing);
    v("simpo_gamma", simpo_gamma);
    v("cpo_alpha", cpo_alpha);
  }
};

struct Config {
  int64_t seed = 0;             // fixes initialisation, data order and augmentation
  bool deterministic = false;   // bitwise-reproducible runs where the backend allows
  std::string device = "auto";  // auto|cpu|cuda|cuda:N
  RunConfig run;                // run directory, logging, evaluation and checkpoint cadence
  ModelConfig model;            // the network
  DataConfig data;              // dataset and loader
  TrainConfig train;            // loop length, accumulation, clipping, loss
  OptimConfig optim;            // optimizer
  SchedConfig sched;            // learning-rate schedule
  AmpConfig amp;                // mixed precision
  DistConfig dist;              // distributed data parallel
  LaunchConfig launch;          // one process, or a local job of several
  TrackingConfig tracking;      // metrics beside metrics.jsonl and TensorBoard
  ProfileConfig profile;        // a window of steps under the profiler
  DpoConfig dpo;                // preference tuning (train.objective: dpo)

  template <class V>
  void visit(V& v) {
    v("seed", seed);
    v("deterministic", deterministic);
    v("device", device);
    v("run", run);
    v("model", model);
    v("data", data);
    v("train", train);
    v("optim", optim);
    v("sched", sched);
    v("amp", amp);
    v("dist", dist);
    v("launch", launch);
    v("tracking", tracking);
    v("profile", profile);
    v("dpo", dpo);
  }
};

}  // namespace trainer::config
