#include "engine/trainer.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "data/dataset.h"
#include "dist/ddp.h"
#include "dist/process_group.h"
#include "engine/flops.h"
#include "engine/memory.h"
#include "engine/metrics.h"
#include "losses/loss.h"
#include "models/model.h"
#include "nn/autocast.h"
#include "nn/batch_norm.h"
#include "nn/rng.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "util/format.h"
#include "util/gpu_monitor.h"
#include "util/log.h"

namespace trainer::engine {
namespace {

using Clock = std::chrono::steady_clock;

// The first line of an error's message, without a LibTorch backtrace.
std::string first_line(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  const std::string what = c10 ? c10->what_without_backtrace() : e.what();
  return what.substr(0, what.find('\n'));
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

[[noreturn]] void config_error(const config::LoadedConfig& loaded, const std::string& key,
                               const std::string& message) {
  throw config::ConfigError({config::Issue{loaded.where(key), key, message}});
}

// A launched job's ranks on a node take one GPU each: cuda:LOCAL_RANK.
torch::Device pick_device(const std::string& name, const dist::DistEnv& job) {
  const std::string gpu = "cuda:" + std::to_string(job.launched() ? job.local_rank : 0);
  if (name == "auto") return torch::cuda::is_available() ? torch::Device(gpu) : torch::kCPU;
  return torch::Device(name == "cuda" ? gpu : name);
}

// Seeds and determinism switches; before anything draws random numbers or touches cuBLAS.
void seed_everything(const config::Config& cfg) {
  torch::manual_seed(static_cast<uint64_t>(cfg.seed));
  // Fixes this thread's intra-op thread count now, before loader threads set theirs to one.
  torch::set_num_threads(cfg.run.threads > 0 ? static_cast<int>(cfg.run.threads)
                                             : torch::get_num_threads());
  auto& ctx = at::globalContext();
  if (cfg.deterministic) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    ctx.setDeterministicAlgorithms(true, /*warn_only=*/false);
    ctx.setDeterministicCuDNN(true);
    ctx.setBenchmarkCuDNN(false);
  } else {
    ctx.setBenchmarkCuDNN(true);
  }
}

}  // namespace

struct Trainer::State {
  const config::LoadedConfig loaded;  // held by value: the caller's copy may go away first
  const config::Config& cfg = loaded.cfg;
  const dist::DistEnv job;  // this process's place in the job
  torch::Device device{torch::kCPU};
  std::unique_ptr<dist::Group> group;       // the job's process group; null when alone
  std::unique_ptr<dist::DataParallel> ddp;  // gradient averaging over the group; null when alone
  data::Splits splits;
  models::InputSpec input;  // what the model was built for
  models::Net model;
  std::unique_ptr<data::Loader> train_loader;
  std::unique_ptr<data::Loader> val_loader;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<optim::Schedule> schedule;
  losses::Loss loss_fn;
  std::vector<torch::Tensor> params;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t step = 0;         // optimizer steps taken
  int64_t bad_samples = 0;  // unreadable samples replaced so far
  bool amp = false;         // autocast around forward and loss
  c10::ScalarType amp_dtype = c10::kBFloat16;
  std::unique_ptr<optim::GradScaler> scaler;  // gradient scaling (float16), else null
  int64_t skipped_steps = 0;         // steps whose update was skipped for inf/NaN gradients or loss
  int64_t bad_steps_in_row = 0;      // consecutive steps with an inf/NaN loss
  bool stop_requested = false;       // this rank was asked to stop; the step's flags agree on it
  StepObserver* observer = nullptr;  // told where each phase of a step begins; null in fit()

  // Where training goes on: the epoch, its next step, and the metrics window in progress. A
  // checkpoint saves exactly these, so a resumed run continues bit for bit.
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
  int64_t last_eval_step = -1;
  int64_t window_steps = 0;  // steps summed in window_loss (those with a finite loss)
  int64_t window_samples = 0;
  torch::Tensor window_loss;     // summed step losses, a device scalar
  int64_t window_cuda_peak = 0;  // the most bytes the window's steps held in tensors (CUDA)
  int64_t resumed_step = -1;     // the step of the checkpoint resumed from; -1 = a fresh run
  std::unique_ptr<checkpoint::Directory> checkpoints;
  std::string last_checkpoint;

  State(const config::LoadedConfig& l, const dist::DistEnv& j) : loaded(l), job(j) {}

  // What one training step did; the same on every rank.
  struct StepOutcome {
    torch::Tensor loss;     // mean loss over the micro-batches, a device scalar (this rank's)
    bool skipped = false;   // the update was not applied (inf/NaN gradients or loss)
    bool bad_loss = false;  // the loss was inf or NaN (on some rank)
    bool stop = false;      // some rank was asked to stop
  };
  StepOutcome train_step(const std::vector<data::Batch>& micro_batches);
  void begin(Phase phase) {
    if (observer) observer->begin(phase);
  }
  // The CPU peak of one forward/backward of `net` at `batch` training samples.
  int64_t step_peak(models::NetImpl& net, bool bf16, int64_t batch);
  // The first `batch` training samples (repeated when the split is smaller), on the CPU.
  data::Batch first_samples(int64_t batch) const;
  // Ranks that must agree on each step's skip and stop decisions (a group of more than one).
  bool agreeing() const { return group && group->world_size() > 1; }
  // Optimizer updates applied so far: the schedule's clock.
  int64_t updates() const { return step - skipped_steps; }
  checkpoint::State snapshot() const;
  void restore(const checkpoint::State& ckpt, const std::string& path);
  // Writes a checkpoint of the current state; false when it failed and the run may go on.
  bool save(const EvalResult* eval);
};

Trainer::Trainer(const config::LoadedConfig& config, const dist::DistEnv& job)
    : s_(std::make_unique<State>(config, job)) {
  const auto& loaded = s_->loaded;
  const auto& cfg = loaded.cfg;
  // Device.
  seed_everything(cfg);
  s_->device = pick_device(cfg.device, job);
  if (s_->device.is_cuda()) c10::impl::getDeviceGuardImpl(torch::kCUDA)->setDevice(s_->device);

  // Process group: every rank of a launched job, even a job of one (the same code path).
  if (job.launched()) {
    dist::GroupOptions group;
    group.backend =
        cfg.dist.backend != "auto" ? cfg.dist.backend : (s_->device.is_cuda() ? "nccl" : "gloo");
    group.device = s_->device;
    group.init_timeout_s = cfg.dist.init_timeout_s;
    group.timeout_s = cfg.dist.timeout_s;
    s_->group = std::make_unique<dist::Group>(job, group);
  }

  // Data (built before the model: the model's input and output sizes come from it).
  config::DataConfig data_cfg = cfg.data;
  if (data_cfg.seq_len == 0) data_cfg.seq_len = cfg.model.block_size;
  if (data_cfg.seq_len > cfg.model.block_size && cfg.model.name == "gpt") {
    config_error(loaded, "data.seq_len",
                 "data.seq_len " + std::to_string(data_cfg.seq_len) + " exceeds model.block_size " +
                     std::to_string(cfg.model.block_size) + "; use 0 to take the block size");
  }
  try {
    s_->splits = data::dataset_registry().get(cfg.data.name)(data_cfg, cfg.seed);
  } catch (const data::DataConfigError& e) {
    config_error(loaded, e.key(), e.message());
  }
  const bool cuda = s_->device.is_cuda();
  data::LoaderOptions train_opts;
  train_opts.batch_size = cfg.data.batch_size;
  train_opts.shuffle = cfg.data.shuffle;
  train_opts.drop_last = cfg.data.drop_last;
  train_opts.workers = cfg.data.workers;
  train_opts.prefetch = cfg.data.prefetch;
  train_opts.seed = static_cast<uint64_t>(cfg.seed);
  train_opts.pin_memory = cuda;
  train_opts.rank = job.rank;
  train_opts.world_size = job.launched() ? job.world_size : 1;
  data::LoaderOptions val_opts = train_opts;
  val_opts.batch_size =
      cfg.data.eval_batch_size > 0 ? cfg.data.eval_batch_size : cfg.data.batch_size;
  val_opts.shuffle = false;
  val_opts.drop_last = false;
  s_->train_loader = std::make_unique<data::Loader>(s_->splits.train, train_opts);
  s_->val_loader = std::make_unique<data::Loader>(s_->splits.val, val_opts);
  s_->steps_per_epoch = s_->train_loader->batches_per_epoch() / cfg.train.grad_accum_steps;
  if (s_->steps_per_epoch == 0) {
    config_error(loaded, "data.batch_size",
                 "data.batch_size " + std::to_string(cfg.data.batch_size) +
                     " x train.grad_accum_steps " + std::to_string(cfg.train.grad_accum_steps) +
                     " leaves no full step in the " + std::to_string(s_->splits.train->size()) +
                     " training samples; use a smaller batch");
  }
  s_->total_steps =
      cfg.train.max_steps > 0 ? cfg.train.max_steps : cfg.train.epochs * s_->steps_per_epoch;

  // Model.
  auto& input = s_->input;
  input = models::InputSpec{s_->splits.spec.sample_shape, cfg.model.num_classes > 0
                                                              ? cfg.model.num_classes
                                                              : s_->splits.spec.num_classes};
  if (s_->splits.spec.sequence && cfg.model.vocab_size > 0 &&
      cfg.model.vocab_size < s_->splits.spec.num_classes) {
    config_error(loaded, "model.vocab_size",
                 "the token data has ids up to " + std::to_string(s_->splits.spec.num_classes - 1) +
                     ", beyond model.vocab_size " + std::to_string(cfg.model.vocab_size) +
                     "; use 0 to take the data's vocabulary");
  }
  if (input.num_classes < s_->splits.spec.num_classes) {
    config_error(loaded, "model.num_classes",
                 "the dataset has " + std::to_string(s_->splits.spec.num_classes) +
                     " classes, more than model.num_classes " + std::to_string(input.num_classes) +
                     "; use 0 to take the dataset's count");
  }
  try {
    s_->model = models::model_registry().get(cfg.model.name)(cfg.model, input);
  } catch (const models::ModelError& e) {
    config_error(loaded, e.key(), e.what());
  }
  if (!cfg.model.pretrained.empty()) {
    checkpoint::SafetensorsFile weights;
    try {
      weights = checkpoint::read_safetensors(cfg.model.pretrained);
    } catch (const checkpoint::FormatError& e) {
      config_error(loaded, "model.pretrained", e.what());
    }
    const std::string problems =
        models::load_weights(*s_->model, weights.tensors, cfg.model.pretrained_skip_head);
    if (!problems.empty()) {
      config_error(loaded, "model.pretrained",
                   cfg.model.pretrained + " does not fit model " + cfg.model.name + ": " +
                       problems +
                       (cfg.model.pretrained_skip_head
                            ? ""
                            : " (model.pretrained_skip_head: true re-initialises the classifier)"));
    }
    log::info("initialised from " + cfg.model.pretrained);
  }
  s_->model->to(s_->device);
  s_->params = models::unique_parameters(*s_->model);
  if (s_->group) {
    dist::DdpOptions ddp;
    ddp.bucket_cap_mb = cfg.dist.bucket_cap_mb;
    ddp.first_bucket_mb = cfg.dist.first_bucket_mb;
    ddp.find_unused_parameters = cfg.dist.find_unused_parameters;
    ddp.broadcast_buffers = cfg.dist.broadcast_buffers;
    ddp.reducer_at_world_size_1 = cfg.dist.reducer_at_world_size_1;
    s_->ddp = std::make_unique<dist::DataParallel>(
        *s_->model, models::unique_named_parameters(*s_->model), *s_->group, ddp);
  }
  if (s_->group && cfg.dist.sync_bn) {
    dist::Group* group = s_->group.get();  // outlives the model (declared before it)
    nn::BatchNormSync sync{group->rank(), group->world_size(), {}};
    // Alone, the global batch is this process's: plain batch norm (no sum).
    if (group->world_size() > 1) {
      sync.sum = [group](torch::Tensor& t) { group->all_reduce({t}, dist::Reduce::sum); };
    }
    if (nn::sync_batch_norm(*s_->model, sync) == 0) {
      config_error(loaded, "dist.sync_bn",
                   "model " + cfg.model.name +
                       " has no batch norm to synchronise; remove "
                       "dist.sync_bn");
    }
  }

  // Optimizer, schedule, loss.
  s_->optimizer = optim::make_optimizer(*s_->model, cfg.optim);
  config::SchedConfig sched = cfg.sched;
  if (sched.warmup_epochs > 0.0) {
    sched.warmup_steps =
        std::llround(sched.warmup_epochs * static_cast<double>(s_->steps_per_epoch));
  }
  s_->schedule = std::make_unique<optim::Schedule>(sched, cfg.optim.lr, s_->total_steps);
  s_->loss_fn = losses::loss_registry().get(cfg.train.loss)(cfg.train);

  // Mixed precision: autocast, and a gradient scaler for float16.
  s_->amp = cfg.amp.enabled;
  s_->amp_dtype = cfg.amp.dtype == "float16" ? c10::kHalf : c10::kBFloat16;
  if (cfg.amp.scaler == "on" ||
      (cfg.amp.scaler == "auto" && cfg.amp.enabled && cfg.amp.dtype == "float16")) {
    optim::GradScalerOptions scaler;
    scaler.init_scale = cfg.amp.init_scale;
    scaler.growth_factor = cfg.amp.growth_factor;
    scaler.backoff_factor = cfg.amp.backoff_factor;
    scaler.growth_interval = cfg.amp.growth_interval;
    s_->scaler = std::make_unique<optim::GradScaler>(scaler, s_->device);
  }
  s_->window_loss = torch::zeros({}, torch::TensorOptions().device(s_->device));
  s_->checkpoints = std::make_unique<checkpoint::Directory>(cfg.run.dir + "/checkpoints",
                                                            cfg.run.keep_last, cfg.run.keep_best);
}

Trainer::~Trainer() = default;

std::string Trainer::summary() const {
  const auto& cfg = s_->cfg;
  std::ostringstream out;
  out << "device: " << s_->device.str() << "\n";
  if (s_->group) {
    out << "distributed: rank " << s_->job.rank << " of " << s_->job.world_size << " ("
        << s_->group->backend() << ", started by " << s_->job.source << "), global batch "
        << cfg.data.batch_size * cfg.train.grad_accum_steps * s_->job.world_size << "\n";
  }
  out << "data: " << cfg.data.name << ", " << s_->splits.train->size() << " train / "
      << s_->splits.val->size() << " val samples, " << s_->splits.spec.num_classes << " classes\n";
  out << "steps: " << s_->total_steps << " (" << s_->steps_per_epoch << " per epoch, batch "
      << cfg.data.batch_size << " x " << cfg.train.grad_accum_steps << " accumulation)\n";
  out << "precision: " << (cfg.amp.enabled ? cfg.amp.dtype + " autocast" : std::string("float32"))
      << (s_->scaler ? " with gradient scaling" : "") << "\n";
  if (cfg.model.checkpointing != "none") {
    out << "activation checkpointing: " << cfg.model.checkpointing << "\n";
  }
  out << models::summary(*s_->model, cfg.model.name);
  return out.str();
}

// One training step over `micro_batches`: forward and backward of each, then one optimizer
// update unless a gradient (with a scaler) or the loss is inf/NaN. The loss stays on the device;
// the one host read per step is the skip (and, in a group, stop) decision, agreed by all ranks.
Trainer::State::StepOutcome Trainer::State::train_step(
    const std::vector<data::Batch>& micro_batches) {
  const double accum = static_cast<double>(micro_batches.size());
  // Gradients dropped (set to none) rather than zeroed; under DDP they are views of its buckets,
  // which Optimizer::zero_grad cannot detach.
  for (auto& p : params) p.mutable_grad().reset();

  // Forward (under autocast) and backward, one micro-batch at a time; gradients add up. With
  // DDP the last micro-batch's backward averages them over the ranks (the others: no_sync).
  torch::Tensor step_loss = torch::zeros({}, torch::TensorOptions().device(device));
  torch::Tensor flags;                  // [bad loss, stop] of this rank, then of any rank
  std::optional<dist::Pending> agreed;  // their all-reduce, in flight during the last backward
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const bool sync = m + 1 == micro_batches.size();
    begin(Phase::forward);
    auto inputs = micro_batches[m].inputs.to(device, /*non_blocking=*/true);    // [B, ...]
    auto targets = micro_batches[m].targets.to(device, /*non_blocking=*/true);  // [B] or [B, T]
    if (ddp) ddp->before_forward(/*first=*/m == 0, sync);
    torch::Tensor loss;  // float32 scalar
    {
      nn::AutocastGuard autocast(device.type(), amp_dtype, /*enabled=*/amp);
      loss = loss_fn(model->forward(inputs), targets) / accum;
    }
    step_loss += loss.detach();
    if (ddp) ddp->after_forward(loss, sync);
    if (sync && agreeing()) {
      flags = torch::stack({step_loss.isfinite().logical_not().to(torch::kFloat),
                            torch::full({}, stop_requested ? 1.0 : 0.0, step_loss.options())});
      agreed = group->all_reduce_async({flags}, dist::Reduce::max);
    }
    begin(Phase::backward);
    (scaler ? scaler->scale(loss) : loss).backward();
  }
  begin(Phase::grad_sync);
  if (ddp) ddp->after_backward();
  begin(Phase::optimizer);

  // Unscale once per step, then decide, the same on every rank: skip the update on inf/NaN
  // gradients (averaged, so equal on every rank) or an inf/NaN loss on any rank; stop when any
  // rank was asked to. One host read per step.
  StepOutcome out{step_loss};
  const torch::Tensor found_inf = scaler ? scaler->unscale(params) : torch::Tensor();
  if (agreed) agreed->wait();
  if (scaler || cfg.train.max_bad_steps > 0 || agreed) {
    // [bad loss, stop when agreeing], then found_inf with a scaler
    std::vector<torch::Tensor> parts{
        agreed ? flags : step_loss.isfinite().logical_not().to(torch::kFloat).reshape({1})};
    if (scaler) parts.push_back(found_inf.reshape({1}));
    const auto host = torch::cat(parts).to(torch::kCPU);
    const auto f = host.accessor<float, 1>();
    out.bad_loss = f[0] != 0.0f;
    out.stop = agreed && f[1] != 0.0f;
    out.skipped = out.bad_loss || (scaler && f[f.size(0) - 1] != 0.0f);
  }

  // Clip by global norm, then update with this step's learning rate.
  if (!out.skipped) {
    if (cfg.train.clip_grad_norm > 0) {
      torch::nn::utils::clip_grad_norm_(params, cfg.train.clip_grad_norm);
    }
    optim::set_lr(*optimizer, schedule->lr(updates()));
    optimizer->step();
  } else {
    ++skipped_steps;
  }
  if (scaler) scaler->update(found_inf);
  ++step;
  return out;
}

namespace {

constexpr const char* kModelPrefix = "model.";

// Config keys whose change makes a checkpoint unusable: the weights' layout and what they mean.
bool must_match(const std::string& key) {
  return (key.rfind("model.", 0) == 0 && key != "model.checkpointing") || key == "optim.name" ||
         key == "data.name" || key == "train.loss";
}

constexpr const char* kOptimPrefix = "optim.";
constexpr const char* kScalerPrefix = "scaler.";

constexpr double kMiB = 1024.0 * 1024.0;

// After a CUDA out-of-memory error on device `index`: what the failed step held and the device has.
std::string cuda_memory_note(int index) {
  const auto m = cuda_memory(index);
  return strprintf(
      "with %.0f MiB in tensors at the peak of the step, %.0f MiB reserved by the "
      "caching allocator, of the device's %.0f MiB ",
      static_cast<double>(m.peak) / kMiB, static_cast<double>(m.reserved) / kMiB,
      static_cast<double>(cuda_total_memory(index)) / kMiB);
}

int cuda_device_count() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

}  // namespace

checkpoint::NamedTensors model_weights(const checkpoint::State& ckpt) {
  return checkpoint::with_prefix(ckpt.tensors, kModelPrefix);
}

checkpoint::State Trainer::State::snapshot() const {
  checkpoint::State out;
  for (const auto& [name, tensor] : models::state_dict(*model)) {
    out.tensors.emplace_back(kModelPrefix + name, tensor);
  }
  for (auto& [name, tensor] :
       optim::optimizer_state(*optimizer, models::unique_named_parameters(*model))) {
    out.tensors.emplace_back(kOptimPrefix + name, tensor);
  }
  out.tensors.emplace_back("rng.cpu", nn::generator_state(nn::cpu_generator()));
  for (int i = 0; i < cuda_device_count(); ++i) {
    out.tensors.emplace_back("rng.cuda." + std::to_string(i),
                             nn::generator_state(nn::cuda_generator(i)));
  }
  out.tensors.emplace_back("engine.window_loss", window_loss);
  if (scaler) {
    for (const auto& [name, tensor] : scaler->state()) {
      out.tensors.emplace_back(kScalerPrefix + name, tensor);
    }
  }
  nlohmann::json config = nlohmann::json::object();
  for (const auto& [key, value] : config::flatten(cfg)) config[key] = value;
  out.meta = {{"format", 1},
              {"step", step},
              {"epoch", epoch},
              {"step_in_epoch", step_in_epoch},
              {"last_eval_step", last_eval_step},
              {"window_steps", window_steps},
              {"window_samples", window_samples},
              {"bad_samples", bad_samples},
              {"skipped_steps", skipped_steps},
              {"bad_steps_in_row", bad_steps_in_row},
              {"config", config},
              {"versions",
               {{"trainer", TRAINER_VERSION},
                {"libtorch", TORCH_VERSION},
                {"cuda_devices", cuda_device_count()}}}};
  return out;
}

void Trainer::State::restore(const checkpoint::State& ckpt, const std::string& path) {
  const auto& meta = ckpt.meta;
  if (!meta.is_object() || meta.value("format", 0) != 1 || !meta.contains("config")) {
    throw checkpoint::CorruptCheckpoint(path + ": not a checkpoint of this trainer version");
  }
  // The config: what must match, and what changed harmlessly.
  const auto& saved = meta.at("config");
  std::vector<config::Issue> conflicts;
  for (const auto& [key, value] : config::flatten(cfg)) {
    if (!saved.contains(key)) continue;
    const std::string before = saved[key].get<std::string>();
    if (before == value) continue;
    if (must_match(key)) {
      conflicts.push_back(config::Issue{loaded.where(key), key,
                                        "is " + value + " but the checkpoint " + path +
                                            " was written with " + before +
                                            "; resume with the same value or start a new run"});
    } else {
      log::info("resuming with " + key + " changed: " + before + " -> " + value);
    }
  }
  if (!conflicts.empty()) throw config::ConfigError(std::move(conflicts));

  std::map<std::string, torch::Tensor> tensors(ckpt.tensors.begin(), ckpt.tensors.end());
  auto take = [&](const std::string& name) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      throw checkpoint::CorruptCheckpoint(path + ": no '" + name + "' tensor");
    }
    return it->second;
  };
  const std::string problems =
      models::load_weights(*model, model_weights(ckpt), /*skip_head=*/false);
  if (!problems.empty()) {
    throw config::ConfigError({config::Issue{
        loaded.where("model.name"), "model.name",
        "the checkpoint " + path + " does not fit model " + cfg.model.name + ": " + problems}});
  }
  const auto optim_state = checkpoint::with_prefix(ckpt.tensors, kOptimPrefix);
  try {
    optim::load_optimizer_state(*optimizer, models::unique_named_parameters(*model),
                                {optim_state.begin(), optim_state.end()});
  } catch (const std::runtime_error& e) {
    throw checkpoint::CorruptCheckpoint(path + ": " + e.what());
  }
  nn::set_generator_state(nn::cpu_generator(), take("rng.cpu"));
  for (int i = 0; i < cuda_device_count(); ++i) {
    auto it = tensors.find("rng.cuda." + std::to_string(i));
    if (it == tensors.end()) continue;  // written without this device
    nn::set_generator_state(nn::cuda_generator(i), it->second);
  }
  window_loss = take("engine.window_loss").to(device);
  step = meta.at("step").get<int64_t>();
  epoch = meta.at("epoch").get<int64_t>();
  step_in_epoch = meta.at("step_in_epoch").get<int64_t>();
  last_eval_step = meta.at("last_eval_step").get<int64_t>();
  window_steps = meta.at("window_steps").get<int64_t>();
  window_samples = meta.at("window_samples").get<int64_t>();
  bad_samples = meta.at("bad_samples").get<int64_t>();
  skipped_steps = meta.value("skipped_steps", int64_t{0});
  bad_steps_in_row = meta.value("bad_steps_in_row", int64_t{0});
  if (scaler) {
    const auto state = checkpoint::with_prefix(ckpt.tensors, kScalerPrefix);
    if (state.empty()) {
      log::info("the checkpoint has no gradient scaler state; the scale starts at amp.init_scale");
    } else {
      try {
        scaler->load_state({state.begin(), state.end()});
      } catch (const std::runtime_error& e) {
        throw checkpoint::CorruptCheckpoint(path + ": " + e.what());
      }
    }
  }
  if (step_in_epoch > steps_per_epoch) {
    throw config::ConfigError({config::Issue{
        loaded.where("data.batch_size"), "data.batch_size",
        "the checkpoint " + path + " stopped after step " + std::to_string(step_in_epoch) +
            " of an epoch, which now has only " + std::to_string(steps_per_epoch) +
            " steps; resume with the batch size and data it was written with"}});
  }
  resumed_step = step;
  last_checkpoint = path;
}

bool Trainer::State::save(const EvalResult* eval) {
  std::map<std::string, double> metrics;
  if (eval && eval->samples > 0) {
    metrics = {
        {"loss", eval->loss}, {"top1", eval->top1}, {"top5", eval->top5}, {"ppl", eval->ppl}};
  }
  // The metrics window's losses averaged over the ranks, so that a resumed run logs what an
  // uninterrupted one does.
  if (group) group->all_reduce({window_loss}, dist::Reduce::avg);
  // Rank 0 writes (every rank holds the same state); the others learn how it went.
  enum Status : int64_t { kSaved, kFailedGoOn, kFailedStop };
  int64_t status = kSaved;
  std::string msg;
  if (job.rank == 0) {
    try {
      const auto start = Clock::now();
      last_checkpoint = checkpoints->save(step, snapshot(), metrics);
      struct stat st;
      const double mb = ::stat(last_checkpoint.c_str(), &st) == 0 ? st.st_size / 1e6 : 0.0;
      log::info(strprintf("checkpoint %s (%.1f MB in %.3f s)", last_checkpoint.c_str(), mb,
                          seconds_since(start)));
    } catch (const std::exception& e) {
      msg = "checkpoint at step " + std::to_string(step) + " not saved: " + e.what() +
            "; the previous checkpoint is intact";
      status = cfg.run.continue_on_save_error ? kFailedGoOn : kFailedStop;
    }
  }
  if (group) {
    auto agreed =
        torch::full({1}, status, torch::TensorOptions(torch::kLong).device(group->device()));
    group->broadcast({agreed}, /*root=*/0);
    status = agreed.item<int64_t>();
  }
  if (status == kFailedStop) {
    throw std::runtime_error(job.rank == 0 ? msg + " (run.continue_on_save_error: true trains on)"
                                           : "rank 0 could not save the checkpoint of step " +
                                                 std::to_string(step) + "; stopping with it");
  }
  if (status == kFailedGoOn && job.rank == 0) log::error(msg);
  return status == kSaved;
}

bool Trainer::resume(const std::string& spec) {
  // Rank 0 picks the checkpoint; every rank loads that file.
  std::optional<std::pair<std::string, checkpoint::State>> latest;
  std::string path = spec;
  if (spec == "auto" && s_->job.rank == 0) {
    latest = s_->checkpoints->load_latest();
    path = latest ? latest->first : "";
  }
  if (s_->group) path = s_->group->broadcast_text(path, /*root=*/0);
  if (path.empty()) {
    log::info("no checkpoint in " + s_->checkpoints->path() + "; starting from step 0");
    return false;
  }
  s_->restore(latest ? std::move(latest->second) : checkpoint::load(path), path);
  log::info(strprintf("resumed from %s at step %lld (epoch %lld, after its step %lld)",
                      s_->last_checkpoint.c_str(), static_cast<long long>(s_->step),
                      static_cast<long long>(s_->epoch),
                      static_cast<long long>(s_->step_in_epoch)));
  return true;
}

std::string Trainer::last_checkpoint() const {
  return s_->last_checkpoint;
}

data::Batch Trainer::State::first_samples(int64_t batch) const {
  std::vector<int64_t> indices(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) indices[static_cast<size_t>(i)] = i % splits.train->size();
  return splits.train->get(indices);
}

int64_t Trainer::State::step_peak(models::NetImpl& net, bool bf16, int64_t batch) {
  if (!device.is_cpu()) throw std::logic_error("memory measurement: the model must be on the CPU");
  const data::Batch b = first_samples(batch);
  net.zero_grad(/*set_to_none=*/true);
  const int64_t peak = measure_cpu_peak([&] {
    torch::Tensor loss;
    {
      nn::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, /*enabled=*/bf16);
      loss = loss_fn(net.forward(b.inputs), b.targets);
    }
    loss.backward();
  });
  net.zero_grad(/*set_to_none=*/true);
  return peak;
}

int Trainer::rank() const {
  return s_->job.rank;
}

int Trainer::world_size() const {
  return s_->group ? s_->group->world_size() : 1;
}

torch::Device Trainer::device() const {
  return s_->device;
}

const config::Config& Trainer::config() const {
  return s_->cfg;
}

int64_t Trainer::tokens_per_sample() const {
  return s_->splits.spec.sequence ? s_->splits.spec.sample_shape.at(0) : 0;
}

void Trainer::run_steps(int64_t steps, StepObserver& observer, bool fixed_batch) {
  auto& s = *s_;
  const int64_t accum = s.cfg.train.grad_accum_steps;
  s.model->train();
  s.observer = &observer;
  std::vector<data::Batch> micro;
  bool epoch_started = false;
  try {
    for (int64_t i = 0; i < steps; ++i) {
      if (s.step_in_epoch == s.steps_per_epoch) {
        ++s.epoch;
        s.step_in_epoch = 0;
        epoch_started = false;
      }
      if (!epoch_started && !(fixed_batch && !micro.empty())) {
        s.train_loader->start_epoch(s.epoch, s.step_in_epoch * accum);
        epoch_started = true;
      }
      observer.begin_step();
      if (!fixed_batch || micro.empty()) {
        micro.clear();
        for (int64_t m = 0; m < accum; ++m) micro.push_back(*s.train_loader->next());
      }
      if (fixed_batch && micro.front().inputs.device() != s.device) {
        for (auto& b : micro) {
          b.inputs = b.inputs.to(s.device);
          b.targets = b.targets.to(s.device);
        }
      }
      const auto outcome = s.train_step(micro);
      ++s.step_in_epoch;
      observer.end_step(outcome.loss);
    }
  } catch (...) {
    s.observer = nullptr;
    throw;
  }
  s.observer = nullptr;
}

int64_t Trainer::forward_flops() {
  auto& s = *s_;
  const auto inputs = s.first_samples(s.cfg.data.batch_size).inputs.to(s.device);  // [B, ...]
  // Evaluation mode leaves batch-norm statistics alone; the counted operations are the same.
  torch::NoGradGuard no_grad;
  s.model->eval();
  const int64_t flops = count_flops([&] {
    nn::AutocastGuard autocast(s.device.type(), s.amp_dtype, /*enabled=*/s.amp);
    s.model->forward(inputs);
  });
  s.model->train();
  return flops;
}

int64_t Trainer::measure_step_memory(bool bf16, int64_t batch) {
  return s_->step_peak(*s_->model, bf16, batch);
}

MemoryEstimate Trainer::estimate_memory(bool bf16, const std::string& checkpointing) {
  auto& s = *s_;
  // Another checkpointing setting: a twin of the model (its weights do not matter here).
  models::Net twin = s.model;
  if (!checkpointing.empty() && checkpointing != s.cfg.model.checkpointing) {
    auto model_cfg = s.cfg.model;
    model_cfg.checkpointing = checkpointing;
    twin = models::model_registry().get(model_cfg.name)(model_cfg, s.input);
  }
  MemoryEstimate e;
  e.dtype = bf16 ? "bfloat16" : "float32";
  for (const auto& p : s.params)
    e.params_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  const auto& o = s.cfg.optim;
  const int64_t copies = o.name == "sgd" ? (o.momentum > 0 ? 1 : 0) : 2;  // adam, adamw: 2 moments
  e.optimizer_bytes = copies * e.params_bytes;
  // Batch norm needs more than one sample per channel in training mode.
  e.measured_batch_small = 2;
  e.measured_batch_large = 4;
  const int64_t small = s.step_peak(*twin, bf16, e.measured_batch_small);
  const int64_t large = s.step_peak(*twin, bf16, e.measured_batch_large);
  e.step_bytes_per_sample =
      std::max<int64_t>((large - small) / (e.measured_batch_large - e.measured_batch_small), 0);
  e.step_fixed_bytes =
      std::max<int64_t>(small - e.step_bytes_per_sample * e.measured_batch_small, 0);
  return e;
}

torch::nn::Module& Trainer::model() {
  return *s_->model;
}

EvalResult Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  s_->model->eval();
  const auto& device = s_->device;
  auto zero = [&] {
    return torch::zeros({}, torch::TensorOptions().device(device).dtype(torch::kDouble));
  };
  // Sums over predictions: one per sample, or one per token for sequences.
  torch::Tensor loss_sum = zero(), top1 = zero(), top5 = zero();
  int64_t predictions = 0;
  s_->val_loader->start_epoch(0);  // this rank's shard
  while (auto batch = s_->val_loader->next()) {
    s_->bad_samples += batch->bad_samples;
    auto inputs = batch->inputs.to(device, /*non_blocking=*/true);  // [B, ...]
    // [N] with N = B, or B * T for sequences
    auto targets = batch->targets.to(device, /*non_blocking=*/true).flatten();
    torch::Tensor logits;  // [B, K] or [B, T, K]
    {
      nn::AutocastGuard autocast(device.type(), s_->amp_dtype, /*enabled=*/s_->amp);
      logits = s_->model->forward(inputs);
    }
    logits = logits.to(torch::kFloat).reshape({targets.size(0), logits.size(-1)});  // [N, K]
    loss_sum += torch::nn::functional::cross_entropy(
        logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    const int64_t k = std::min<int64_t>(5, logits.size(1));
    auto topk = std::get<1>(logits.topk(k, /*dim=*/1));  // [N, k]
    auto hit = topk.eq(targets.unsqueeze(1));            // [N, k]
    top1 += hit.select(/*dim=*/1, /*index=*/0).sum();
    top5 += hit.any(/*dim=*/1).sum();
    predictions += targets.size(0);
  }
  s_->model->train();
  if (s_->group) {  // sums over every rank's shard
    auto sums = torch::stack({loss_sum, top1, top5, torch::full_like(loss_sum, predictions)});
    s_->group->all_reduce({sums}, dist::Reduce::sum);
    sums = sums.cpu();
    loss_sum = sums[0], top1 = sums[1], top5 = sums[2];
    predictions = static_cast<int64_t>(sums[3].item<double>());
  }
  EvalResult r;
  r.samples = predictions;
  r.sequence = s_->splits.spec.sequence;
  if (predictions > 0) {
    const double n = static_cast<double>(predictions);
    r.loss = loss_sum.item<double>() / n;
    r.top1 = top1.item<double>() / n;
    r.top5 = top5.item<double>() / n;
    r.ppl = std::exp(r.loss);
  }
  return r;
}

FitResult Trainer::fit(const std::atomic<bool>* stop) {
  auto& s = *s_;
  const auto& cfg = s.cfg;
  // Only rank 0 writes the run dir.
  std::unique_ptr<MetricsWriter> writer;
  if (s.job.rank == 0) {
    writer =
        std::make_unique<MetricsWriter>(cfg.run.dir, cfg.run.tensorboard, s.resumed_step,
                                        s.resumed_step >= 0 && s.last_eval_step == s.resumed_step);
  }
  auto write_metrics = [&](const nlohmann::json& record) {
    if (writer) writer->write(record);
  };
  Progress progress(s.job.rank == 0 ? cfg.run.progress : "never");
  FitResult result;
  const auto start = Clock::now();
  const int64_t first_step = s.step;
  s.model->train();

  // On a GPU: the caching allocator's peak and NVML's readings in the train records.
  const bool cuda = s.device.is_cuda();
  const int cuda_index = s.device.has_index() ? s.device.index() : 0;
  std::unique_ptr<GpuMonitor> gpu;
  if (cuda) {
    std::string why;
    gpu = GpuMonitor::open(cuda_index, &why);
    if (!gpu) log::info("GPU monitoring off: " + why);
  }
  auto window_start = Clock::now();
  double last_loss = NAN, last_sps = 0.0;
  EvalResult last_eval;  // of the current step, for the checkpoint's metrics
  int64_t saved_step = s.resumed_step;

  // Seconds left at the average step time of this process.
  auto eta = [&] {
    return seconds_since(start) / static_cast<double>(s.step - first_step) *
           static_cast<double>(s.total_steps - s.step);
  };
  auto checkpoint = [&] {
    if (saved_step == s.step) return;
    s.save(s.last_eval_step == s.step ? &last_eval : nullptr);
    saved_step = s.step;
  };
  auto run_eval = [&](int64_t epoch) {
    progress.clear();
    last_eval = result.last_eval = evaluate();
    s.last_eval_step = s.step;
    const auto& e = result.last_eval;
    if (e.sequence) {
      write_metrics(
          {{"split", "val"}, {"step", s.step}, {"epoch", epoch}, {"loss", e.loss}, {"ppl", e.ppl}});
      log::info(strprintf("eval step %lld epoch %lld: loss %.4f ppl %.3f (%lld tokens)",
                          static_cast<long long>(s.step), static_cast<long long>(epoch), e.loss,
                          e.ppl, static_cast<long long>(e.samples)));
      return;
    }
    write_metrics({{"split", "val"},
                   {"step", s.step},
                   {"epoch", epoch},
                   {"loss", e.loss},
                   {"top1", e.top1},
                   {"top5", e.top5}});
    log::info(
        strprintf("eval step %lld epoch %lld: loss %.4f top1 %.2f%% top5 %.2f%% (%lld samples)",
                  static_cast<long long>(s.step), static_cast<long long>(epoch), e.loss,
                  100.0 * e.top1, 100.0 * e.top5, static_cast<long long>(e.samples)));
    if (cfg.train.stop_at_top1 > 0.0 && e.top1 >= cfg.train.stop_at_top1) {
      result.reached_target = true;
      log::info(
          strprintf("top-1 %.2f%% reached train.stop_at_top1 %.2f%% after %.1f s; ending the run",
                    100.0 * e.top1, 100.0 * cfg.train.stop_at_top1, seconds_since(start)));
    }
  };
  // A step whose loss was inf/NaN was skipped; too many in a row end the run with a checkpoint.
  auto on_bad_loss = [&](int64_t epoch) {
    ++s.bad_steps_in_row;
    progress.clear();
    log::warn(
        strprintf("step %lld epoch %lld: the loss is inf/NaN; update skipped (%lld in a row, "
                  "train.max_bad_steps %lld)",
                  static_cast<long long>(s.step), static_cast<long long>(epoch),
                  static_cast<long long>(s.bad_steps_in_row),
                  static_cast<long long>(cfg.train.max_bad_steps)));
    if (s.bad_steps_in_row < cfg.train.max_bad_steps) return;
    checkpoint();
    throw std::runtime_error(strprintf(
        "the training loss was inf/NaN in %lld steps in a row, steps %lld to %lld; the model is "
        "as after step %lld, saved in %s; lower optim.lr, set train.clip_grad_norm, or use "
        "amp.dtype bfloat16",
        static_cast<long long>(s.bad_steps_in_row),
        static_cast<long long>(s.step - s.bad_steps_in_row + 1), static_cast<long long>(s.step),
        static_cast<long long>(s.step - s.bad_steps_in_row), s.last_checkpoint.c_str()));
  };
  auto log_train = [&](int64_t epoch) {
    const double seconds = seconds_since(window_start);
    double loss_sum = 0.0, samples = static_cast<double>(s.window_samples);
    if (s.group) {  // the mean loss and the samples of every rank
      auto sums = torch::stack({s.window_loss.to(torch::kDouble),
                                torch::full_like(s.window_loss, samples, torch::kDouble)});
      s.group->all_reduce({sums}, dist::Reduce::sum);
      sums = sums.cpu();
      loss_sum = sums[0].item<double>() / s.job.world_size;
      samples = sums[1].item<double>();
    } else if (s.window_steps > 0) {
      loss_sum = s.window_loss.item<double>();
    }
    // NAN when every step of the window had a bad loss (and was skipped).
    last_loss = s.window_steps > 0 ? loss_sum / static_cast<double>(s.window_steps) : NAN;
    last_sps = seconds > 0 ? samples / seconds : 0.0;
    const double lr = s.schedule->lr(std::max<int64_t>(s.updates() - 1, 0));
    if (s.window_steps > 0 && !std::isfinite(last_loss)) {  // train.max_bad_steps: 0
      progress.clear();
      throw std::runtime_error("the training loss is " + std::to_string(last_loss) + " at step " +
                               std::to_string(s.step) +
                               "; lower optim.lr or set train.clip_grad_norm");
    }
    nlohmann::json record = {{"split", "train"},
                             {"step", s.step},
                             {"epoch", epoch},
                             {"lr", lr},
                             {"samples_per_sec", last_sps},
                             {"bad_samples", s.bad_samples}};
    if (s.window_steps > 0) record["loss"] = last_loss;
    if (s.scaler) record["loss_scale"] = s.scaler->scale_value();
    if (s.scaler || s.skipped_steps > 0) record["skipped_steps"] = s.skipped_steps;
    std::string line = strprintf(
        "step %lld/%lld epoch %lld loss %.4f lr %.3g %.0f samples/s ETA %s",
        static_cast<long long>(s.step), static_cast<long long>(s.total_steps),
        static_cast<long long>(epoch), last_loss, lr, last_sps, format_duration(eta()).c_str());
    if (cuda) {  // the caching allocator's view: what this process's tensors took
      record["cuda_peak_mb"] = static_cast<double>(s.window_cuda_peak) / kMiB;
      record["cuda_reserved_mb"] = static_cast<double>(cuda_memory(cuda_index).reserved) / kMiB;
      line += strprintf(" | peak %.0f MiB", static_cast<double>(s.window_cuda_peak) / kMiB);
      s.window_cuda_peak = 0;
    }
    if (const auto g = gpu ? gpu->sample() : std::nullopt) {
      record["gpu_util"] = g->util_pct;
      record["gpu_mem_mb"] = g->mem_used_mb;
      record["gpu_temp_c"] = g->temp_c;
      record["gpu_power_w"] = g->power_w;
      line += strprintf(" | GPU %.0f%% %.0f/%.0f MiB %.0f C %.0f W", g->util_pct, g->mem_used_mb,
                        g->mem_total_mb, g->temp_c, g->power_w);
    }
    write_metrics(record);
    if (progress.active()) {
      log::file_only(log::Level::info, line);
    } else {
      log::info(line);
    }
    s.window_steps = s.window_samples = 0;
    s.window_loss.zero_();
    window_start = Clock::now();
  };

  log::info(strprintf("training %lld steps (%lld per epoch) on %s",
                      static_cast<long long>(s.total_steps - s.step),
                      static_cast<long long>(s.steps_per_epoch), s.device.str().c_str()));
  std::vector<data::Batch> micro;
  for (; s.step < s.total_steps && !result.stopped; ++s.epoch, s.step_in_epoch = 0) {
    const int64_t epoch = s.epoch;
    s.train_loader->start_epoch(epoch, s.step_in_epoch * cfg.train.grad_accum_steps);
    while (s.step_in_epoch < s.steps_per_epoch && s.step < s.total_steps) {
      micro.clear();
      for (int64_t m = 0; m < cfg.train.grad_accum_steps; ++m) {
        micro.push_back(*s.train_loader->next());
        s.window_samples += micro.back().targets.size(0);
        s.bad_samples += micro.back().bad_samples;
      }
      State::StepOutcome outcome;
      s.stop_requested = stop && stop->load();
      try {
        if (cuda) reset_cuda_peak(cuda_index);
        outcome = s.train_step(micro);
        if (cuda) {
          s.window_cuda_peak = std::max(s.window_cuda_peak, cuda_memory(cuda_index).peak);
        }
      } catch (const c10::OutOfMemoryError& e) {
        progress.clear();
        throw std::runtime_error(strprintf(
            "out of memory in step %lld at data.batch_size %lld x train.grad_accum_steps %lld "
            "%s(%s); `trainer doctor --config %s` estimates the step's memory and lists remedies: "
            "a smaller data.batch_size with more train.grad_accum_steps, bfloat16, activation "
            "checkpointing, more GPUs",
            static_cast<long long>(s.step + 1), static_cast<long long>(cfg.data.batch_size),
            static_cast<long long>(cfg.train.grad_accum_steps),
            cuda ? cuda_memory_note(cuda_index).c_str() : "", first_line(e).c_str(),
            s.loaded.source.c_str()));
      } catch (const std::exception& e) {
        if (!s.group) throw;
        // Gloo reports a lost peer or a timeout as a plain error: every failure of a step in a
        // group names the collective timeout as a possible cause.
        throw std::runtime_error(
            strprintf("rank %d: step %lld failed: %s (when another rank has ended or is stuck, "
                      "collectives fail after dist.timeout_s, %g s)",
                      s.job.rank, static_cast<long long>(s.step + 1), first_line(e).c_str(),
                      cfg.dist.timeout_s));
      }
      ++s.step_in_epoch;
      if (outcome.bad_loss) {
        on_bad_loss(epoch);
      } else {
        s.bad_steps_in_row = 0;
        s.window_loss += outcome.loss;
        ++s.window_steps;
      }
      if (s.step % cfg.run.log_every == 0 || s.step == s.total_steps) log_train(epoch);
      progress.update(s.step, s.total_steps, epoch, last_loss, last_sps, eta());
      if (cfg.run.eval_every > 0 && s.step % cfg.run.eval_every == 0) run_eval(epoch);
      if (cfg.run.checkpoint_every > 0 && s.step % cfg.run.checkpoint_every == 0) checkpoint();
      if (result.reached_target) break;
      const bool stop_here =
          cfg.train.stop_at_step > 0 && s.step == cfg.train.stop_at_step && s.step < s.total_steps;
      // A group stops where its ranks agreed to (the step's flags); alone, at once.
      const bool signalled = s.agreeing() ? outcome.stop : stop && stop->load();
      if (signalled || stop_here) {
        progress.clear();
        log::warn(strprintf("stopping after step %lld (%s); resume with --resume auto",
                            static_cast<long long>(s.step),
                            stop_here ? "train.stop_at_step" : "signal"));
        result.stopped = true;
        break;
      }
    }
    if (result.stopped || result.reached_target) break;
    if (cfg.run.eval_every == 0 && s.last_eval_step != s.step) run_eval(epoch);
    // Resuming from the end of an epoch runs no step of it and goes on with the next.
    if (cfg.run.checkpoint_every == 0 && s.step_in_epoch == s.steps_per_epoch) checkpoint();
    if (result.reached_target) break;
  }
  if (!result.stopped) {
    if (cfg.train.eval_at_end && s.last_eval_step != s.step) {
      run_eval(s.total_steps > 0 ? (s.step - 1) / s.steps_per_epoch : 0);
    }
  }
  checkpoint();
  progress.clear();
  result.steps = s.step;
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace trainer::engine
