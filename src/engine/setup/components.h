// Everything a run trains with, built from a validated config: the part of the engine that knows
// how the registries' pieces fit together.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "config/loader.h"
#include "data/dataset.h"
#include "distributed/ddp.h"
#include "distributed/env.h"
#include "distributed/fsdp.h"
#include "distributed/process_group.h"
#include "distributed/tensor_parallel.h"
#include "losses/loss.h"
#include "losses/output_loss.h"
#include "models/model.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace trainer::engine {

class Objective;  // engine/setup/objective.h

// Autocast around forward and loss.
struct Precision {
  bool autocast = false;                   // amp.enabled
  c10::ScalarType dtype = c10::kBFloat16;  // amp.dtype
};

// What build_components builds: the run's parts to train with, or a plan of them (trainer
// doctor --config, --dry-run): the model on the meta device (nn/deferred_init.h), its
// parameters' shapes and dtypes without storage, model.pretrained's files checked against it
// from their headers, no tensor read; no DDP or FSDP wrapping.
enum class Build { train, plan };

// Declared in the order they are built; the process group outlives what uses it (the model's
// synchronised batch norm, DDP).
struct Components {
  Build build = Build::train;
  torch::Device device{torch::kCPU};
  std::unique_ptr<distributed::Group> group;  // the job's process group; null when alone
  // dist.tp_size > 1: this rank's tensor-parallel group (tp_size consecutive ranks, the model's
  // layers split over them) and its data-parallel group (the ranks holding the same parts, one
  // in each tensor-parallel group); both null otherwise.
  std::unique_ptr<distributed::Group> tp_group;
  std::unique_ptr<distributed::Group> dp_group;
  std::shared_ptr<distributed::GroupTensorParallel> tp;  // over tp_group; null without
  data::Splits splits;
  std::unique_ptr<data::Loader> train_loader;  // this rank's shard of the training split
  std::unique_ptr<data::Loader> val_loader;    // this rank's shard of the validation split
  int64_t steps_per_epoch = 0;                 // optimizer steps in one epoch of this rank
  int64_t total_steps = 0;                     // optimizer steps of the whole run
  models::InputSpec input;                     // what the model was built for
  models::Net model;
  nn::SplitPlan tp_plan;  // how the model's parameters split over tp_group (empty without)
  std::string lora_base;  // model.lora: the frozen base's identity (adapter_state.h); "" without
  std::vector<torch::Tensor> params;  // what the optimizer updates: the model's trainable
                                      // parameters (tied ones once; with model.lora the
                                      // adapters), or with fsdp this rank's shards of them
  std::unique_ptr<distributed::DataParallel> ddp;  // gradient averaging; null when alone or fsdp
  std::unique_ptr<distributed::FullyShardedDataParallel> fsdp;  // dist.strategy fsdp, else null
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::Schedule> schedule;
  losses::Loss loss;
  // train.loss of the output layer's hidden states and weight when the model asks for it
  // (NetImpl::output_weight); null under tensor parallelism or when the loss has none.
  losses::OutputLoss output_loss;
  // train.objective's loss of a micro-batch when it is not train.loss of the model's outputs
  // (dpo: the preference step); null for supervised.
  std::shared_ptr<Objective> objective;
  Precision precision;
  std::unique_ptr<optim::GradScaler> scaler;  // gradient scaling (float16 training), else null

  // The processes training together (1 when alone).
  int world_size() const;
  // The ranks each layer splits over (dist.tp_size; 1 without tensor parallelism).
  int tp_size() const { return tp ? tp->size() : 1; }
  // The model's replicas, each reading its own batches: world_size() / tp_size().
  int data_parallel_size() const { return world_size() / tp_size(); }
  // The group gradients are averaged over and the data is sharded over: dp_group with tensor
  // parallelism, else the job's group (null when alone).
  distributed::Group* data_group() const { return dp_group ? dp_group.get() : group.get(); }
  // The model's outputs for every class: under tensor parallelism each rank's [..., K / tp]
  // joined over tp_group (every rank of the group must call this, in the same order), else
  // `outputs` as they are.
  torch::Tensor whole_outputs(const torch::Tensor& outputs) const;
  // What the step calls around its micro-batches: fsdp or ddp; null when neither.
  distributed::DataParallelism* data_parallel() const {
    return fsdp ? static_cast<distributed::DataParallelism*>(fsdp.get()) : ddp.get();
  }
  // Whether the ranks must agree on each step's skip and stop decisions (a group of more than
  // one).
  bool agreeing() const { return world_size() > 1; }
};

// Seeds the RNGs, picks the device and builds, in order: the process group (a launched `job`,
// even a job of one), the data, the model (activation checkpointing inside, model.pretrained
// weights, DDP and synchronised batch norm in a group, or with dist.strategy fsdp its parameters
// sharded, alone too), the optimizer (over the shards with fsdp), schedule, loss and mixed
// precision. Every rank of a job must call this, in the same order (it forms the group and
// broadcasts rank 0's weights). Throws config::ConfigError for settings the model or data
// reject, data::DataError for unreadable data, distributed::GroupError when the ranks cannot form
// their group. Build::plan allocates no parameter (see Build).
Components build_components(const config::LoadedConfig& loaded, const distributed::DistEnv& job,
                            Build build = Build::train);

// The splits' class labels mapped through `to_model` (data label -> model label), their loaders
// built anew: a checkpoint's classes in another order than the data's (data.remap_classes).
void relabel(Components& c, const config::Config& cfg, const distributed::DistEnv& job,
             const std::vector<int64_t>& to_model);

// The dtype of a config's name for one: bfloat16, float16, else float32.
c10::ScalarType dtype_named(const std::string& name);

// What the data set of `cfg` is built for: the run's seed and the model's context length.
data::DataContext data_context(const config::Config& cfg);

// The configuration defaults with every registered model's, data set's and optimizer's own keys:
// what config::load starts from.
config::Config config_defaults();

// config::load over config_defaults(): how the trainer reads a config file. Does not validate.
config::LoadedConfig load_config(const std::string& path,
                                 const std::vector<std::string>& overrides);

// What configs are validated against: the CUDA devices present and every registry's names.
config::Environment config_environment();

// A config that under-delivers without failing: a warm-up longer than the run (the learning rate
// never reaches optim.lr), as one line naming what reaches what; "" when there is none.
std::string warmup_warning(const config::Config& cfg, const Components& c);

}  // namespace trainer::engine
