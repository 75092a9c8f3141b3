#include "engine/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "data/dataset.h"
#include "engine/metrics.h"
#include "losses/loss.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

[[noreturn]] void config_error(const config::LoadedConfig& loaded, const std::string& key,
                               const std::string& message) {
  throw config::ConfigError({config::Issue{loaded.where(key), key, message}});
}

torch::Device pick_device(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? torch::Device("cuda:0") : torch::kCPU;
  return torch::Device(name == "cuda" ? "cuda:0" : name);
}

// Seeds and determinism switches; before anything draws random numbers or touches cuBLAS.
void seed_everything(const config::Config& cfg) {
  torch::manual_seed(static_cast<uint64_t>(cfg.seed));
  if (cfg.run.threads > 0) torch::set_num_threads(static_cast<int>(cfg.run.threads));
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
  torch::Device device{torch::kCPU};
  data::Splits splits;
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

  explicit State(const config::LoadedConfig& l) : loaded(l) {}

  torch::Tensor train_step(const std::vector<data::Batch>& micro_batches);
};

Trainer::Trainer(const config::LoadedConfig& config) : s_(std::make_unique<State>(config)) {
  const auto& loaded = s_->loaded;
  const auto& cfg = loaded.cfg;
  if (cfg.amp.enabled) {
    config_error(loaded, "amp.enabled",
                 "mixed precision is not available in this build; set "
                 "amp.enabled: false");
  }
  if (cfg.model.checkpointing != "none") {
    config_error(loaded, "model.checkpointing",
                 "model '" + cfg.model.name + "' has no blocks to checkpoint; use none");
  }
  if (!cfg.model.pretrained.empty()) {
    config_error(loaded, "model.pretrained",
                 "loading pretrained weights is not available in this build; leave it empty");
  }

  // Device.
  seed_everything(cfg);
  s_->device = pick_device(cfg.device);

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
  models::InputSpec input{s_->splits.spec.sample_shape, cfg.model.num_classes > 0
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
  s_->model->to(s_->device);
  s_->params = models::unique_parameters(*s_->model);

  // Optimizer, schedule, loss.
  s_->optimizer = optim::make_optimizer(*s_->model, cfg.optim);
  config::SchedConfig sched = cfg.sched;
  if (sched.warmup_epochs > 0.0) {
    sched.warmup_steps =
        std::llround(sched.warmup_epochs * static_cast<double>(s_->steps_per_epoch));
  }
  s_->schedule = std::make_unique<optim::Schedule>(sched, cfg.optim.lr, s_->total_steps);
  s_->loss_fn = losses::loss_registry().get(cfg.train.loss)(cfg.train);
}

Trainer::~Trainer() = default;

std::string Trainer::summary() const {
  const auto& cfg = s_->cfg;
  std::ostringstream out;
  out << "device: " << s_->device.str() << "\n";
  out << "data: " << cfg.data.name << ", " << s_->splits.train->size() << " train / "
      << s_->splits.val->size() << " val samples, " << s_->splits.spec.num_classes << " classes\n";
  out << "steps: " << s_->total_steps << " (" << s_->steps_per_epoch << " per epoch, batch "
      << cfg.data.batch_size << " x " << cfg.train.grad_accum_steps << " accumulation)\n";
  out << models::summary(*s_->model, cfg.model.name);
  return out.str();
}

// One optimizer step over `micro_batches`; returns the step's mean loss as a device scalar (no
// host synchronisation).
torch::Tensor Trainer::State::train_step(const std::vector<data::Batch>& micro_batches) {
  const double accum = static_cast<double>(micro_batches.size());
  optimizer->zero_grad(/*set_to_none=*/true);

  // Forward and backward, one micro-batch at a time; gradients add up across them.
  torch::Tensor step_loss = torch::zeros({}, torch::TensorOptions().device(device));
  for (const auto& batch : micro_batches) {
    auto inputs = batch.inputs.to(device, /*non_blocking=*/true);    // [B, ...]
    auto targets = batch.targets.to(device, /*non_blocking=*/true);  // [B] or [B, T]
    auto loss = loss_fn(model->forward(inputs), targets) / accum;
    loss.backward();
    step_loss += loss.detach();
  }

  // Clip by global norm, then step with this step's learning rate.
  if (cfg.train.clip_grad_norm > 0) {
    torch::nn::utils::clip_grad_norm_(params, cfg.train.clip_grad_norm);
  }
  optim::set_lr(*optimizer, schedule->lr(step));
  optimizer->step();
  ++step;
  return step_loss;
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
  s_->val_loader->start_epoch(0);
  while (auto batch = s_->val_loader->next()) {
    s_->bad_samples += batch->bad_samples;
    auto inputs = batch->inputs.to(device, /*non_blocking=*/true);  // [B, ...]
    // [N] with N = B, or B * T for sequences
    auto targets = batch->targets.to(device, /*non_blocking=*/true).flatten();
    auto logits = s_->model->forward(inputs);                     // [B, K] or [B, T, K]
    logits = logits.reshape({targets.size(0), logits.size(-1)});  // [N, K]
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
  MetricsWriter metrics(cfg.run.dir, cfg.run.tensorboard);
  Progress progress(cfg.run.progress);
  FitResult result;
  const auto start = Clock::now();
  s.model->train();

  // The current log window: steps, samples, summed device losses and when it started.
  int64_t window_steps = 0, window_samples = 0;
  torch::Tensor window_loss = torch::zeros({}, torch::TensorOptions().device(s.device));
  auto window_start = Clock::now();
  double last_loss = NAN, last_sps = 0.0;
  int64_t last_eval_step = -1;

  // Seconds left at the average step time so far.
  auto eta = [&] {
    return seconds_since(start) / static_cast<double>(s.step) *
           static_cast<double>(s.total_steps - s.step);
  };
  auto run_eval = [&](int64_t epoch) {
    progress.clear();
    result.last_eval = evaluate();
    last_eval_step = s.step;
    const auto& e = result.last_eval;
    if (e.sequence) {
      metrics.write(
          {{"split", "val"}, {"step", s.step}, {"epoch", epoch}, {"loss", e.loss}, {"ppl", e.ppl}});
      log::info(strprintf("eval step %lld epoch %lld: loss %.4f ppl %.3f (%lld tokens)",
                          static_cast<long long>(s.step), static_cast<long long>(epoch), e.loss,
                          e.ppl, static_cast<long long>(e.samples)));
      return;
    }
    metrics.write({{"split", "val"},
                   {"step", s.step},
                   {"epoch", epoch},
                   {"loss", e.loss},
                   {"top1", e.top1},
                   {"top5", e.top5}});
    log::info(
        strprintf("eval step %lld epoch %lld: loss %.4f top1 %.2f%% top5 %.2f%% (%lld samples)",
                  static_cast<long long>(s.step), static_cast<long long>(epoch), e.loss,
                  100.0 * e.top1, 100.0 * e.top5, static_cast<long long>(e.samples)));
  };
  auto log_train = [&](int64_t epoch) {
    const double seconds = seconds_since(window_start);
    last_loss = window_loss.item<double>() / static_cast<double>(window_steps);
    last_sps = seconds > 0 ? static_cast<double>(window_samples) / seconds : 0.0;
    const double lr = s.schedule->lr(s.step - 1);
    if (!std::isfinite(last_loss)) {
      progress.clear();
      throw std::runtime_error("the training loss is " + std::to_string(last_loss) + " at step " +
                               std::to_string(s.step) +
                               "; lower optim.lr or set train.clip_grad_norm");
    }
    metrics.write({{"split", "train"},
                   {"step", s.step},
                   {"epoch", epoch},
                   {"loss", last_loss},
                   {"lr", lr},
                   {"samples_per_sec", last_sps},
                   {"bad_samples", s.bad_samples}});
    const std::string line = strprintf(
        "step %lld/%lld epoch %lld loss %.4f lr %.3g %.0f samples/s ETA %s",
        static_cast<long long>(s.step), static_cast<long long>(s.total_steps),
        static_cast<long long>(epoch), last_loss, lr, last_sps, format_duration(eta()).c_str());
    if (progress.active()) {
      log::file_only(log::Level::info, line);
    } else {
      log::info(line);
    }
    window_steps = window_samples = 0;
    window_loss.zero_();
    window_start = Clock::now();
  };

  log::info(strprintf("training %lld steps (%lld per epoch) on %s",
                      static_cast<long long>(s.total_steps),
                      static_cast<long long>(s.steps_per_epoch), s.device.str().c_str()));
  std::vector<data::Batch> micro;
  for (int64_t epoch = 0; s.step < s.total_steps && !result.stopped; ++epoch) {
    s.train_loader->start_epoch(epoch);
    for (int64_t i = 0; i < s.steps_per_epoch && s.step < s.total_steps; ++i) {
      micro.clear();
      for (int64_t m = 0; m < cfg.train.grad_accum_steps; ++m) {
        micro.push_back(*s.train_loader->next());
        window_samples += micro.back().targets.size(0);
        s.bad_samples += micro.back().bad_samples;
      }
      window_loss += s.train_step(micro);
      ++window_steps;
      if (s.step % cfg.run.log_every == 0 || s.step == s.total_steps) log_train(epoch);
      progress.update(s.step, s.total_steps, epoch, last_loss, last_sps, eta());
      if (cfg.run.eval_every > 0 && s.step % cfg.run.eval_every == 0) run_eval(epoch);
      if (stop && stop->load()) {
        result.stopped = true;
        break;
      }
    }
    if (cfg.run.eval_every == 0 && !result.stopped && last_eval_step != s.step) run_eval(epoch);
  }
  if (cfg.train.eval_at_end && !result.stopped && last_eval_step != s.step) {
    run_eval(s.total_steps > 0 ? (s.step - 1) / s.steps_per_epoch : 0);
  }
  progress.clear();
  result.steps = s.step;
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace trainer::engine
