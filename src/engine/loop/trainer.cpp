#include "engine/loop/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <sstream>

#include "distributed/failure_text.h"
#include "engine/loop/batches.h"
#include "engine/loop/graphed_step.h"
#include "engine/loop/stop_target.h"
#include "engine/loop/trainer_state.h"
#include "engine/measure/flops.h"
#include "engine/measure/op_count.h"
#include "engine/measure/run_peak.h"
#include "engine/observe/memory_history.h"
#include "engine/observe/metrics.h"
#include "engine/observe/profile_window.h"
#include "engine/setup/components.h"
#include "nn/autocast.h"
#include "util/device.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::engine {

namespace {

// Why a step ran out of memory, and what to do about it.
std::string out_of_memory_message(const Components& parts, const config::LoadedConfig& loaded,
                                  int64_t step, const std::string& error,
                                  const std::string& snapshot) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::string held;
  if (parts.device.is_cuda()) {
    const int index = parts.device.has_index() ? parts.device.index() : 0;
    const auto m = cuda_memory(index);
    held = strprintf(
        "with %.0f MiB in tensors at the peak of the step, %.0f MiB reserved by the caching "
        "allocator, of the device's %.0f MiB ",
        static_cast<double>(m.peak) / kMiB, static_cast<double>(m.reserved) / kMiB,
        static_cast<double>(cuda_total_memory(index)) / kMiB);
  }
  const auto& cfg = loaded.cfg;
  return strprintf(
      "out of memory in step %" PRId64 " at data.batch_size %" PRId64
      " x train.grad_accum_steps %" PRId64
      " %s(%s); `trainer doctor --config %s` estimates the step's memory and lists remedies: "
      "a smaller data.batch_size with more train.grad_accum_steps, bfloat16, activation "
      "checkpointing, more GPUs%s",
      step, cfg.data.batch_size, cfg.train.grad_accum_steps, held.c_str(), error.c_str(),
      loaded.source.c_str(),
      snapshot.empty() ? ""
                       : ("; the allocator's history until then is in " + snapshot +
                          " (python -m torch.cuda._memory_viz trace_plot " + snapshot + ")")
                             .c_str());
}

// data.drop_last: the training samples each epoch leaves out (its last, short batch of each
// rank), or "" when it leaves none out.
std::string dropped_samples_line(const config::Config& cfg, const Components& parts) {
  if (!cfg.data.drop_last || !parts.splits.train || !parts.train_loader) return "";
  const int64_t n = parts.splits.train->size();
  const int64_t ranks = parts.data_parallel_size();
  const int64_t dropped = n - parts.train_loader->samples_per_epoch() * ranks;
  if (dropped <= 0) return "";
  return strprintf("data.drop_last: each epoch leaves out %" PRId64 " of the %" PRId64
                   " training samples (batches of %" PRId64 " on %" PRId64
                   " rank(s)); set data.drop_last: false to train on every one",
                   dropped, n, cfg.data.batch_size, ranks);
}

// One run of fit(): the loop's decisions after each step and at each epoch's end.
class Run {
 public:
  Run(Trainer::State& s, const std::atomic<bool>* stop)
      : s_(s),
        cfg_(s.loaded.cfg),
        stop_(stop),
        log_(cfg_, s.parts, s.state, s.job.rank, s.checkpointer.resumed_step()),
        profile_(cfg_.profile, s.parts.device, cfg_.run.dir, s.job.rank),
        memory_(cfg_.profile, s.parts.device, cfg_.run.dir, s.job.rank) {
    s.parts.model->train();
    log::info(strprintf("training %" PRId64 " steps (%" PRId64 " per epoch) on %s",
                        s.parts.total_steps - s.state.step, s.parts.steps_per_epoch,
                        s.parts.device.str().c_str()));
    if (const auto dropped = dropped_samples_line(cfg_, s.parts); !dropped.empty()) {
      log::info(dropped);
    }
  }

  bool steps_left() const { return s_.state.step < s_.parts.total_steps; }
  MetricsLog& log() { return log_; }

  // Trains one step and logs, evaluates and checkpoints as configured; false when the run ends
  // here (a stop, train.stop_at_step, or a target of train.stop_at or train.stop_at_top1).
  bool step(const std::vector<data::Batch>& micro_batches) {
    log_.count(micro_batches);
    const Settled settled = train(micro_batches);
    if (!settled.abandoned) s_.after_step();
    for (const auto& outcome : settled.outcomes) take(outcome);
    const int64_t step = s_.state.step;
    memory_.after(step);
    const bool log_due = step % cfg_.run.log_every == 0 || step == s_.parts.total_steps;
    const bool eval_due = cfg_.run.eval_every > 0 && step % cfg_.run.eval_every == 0;
    const bool checkpoint_due =
        cfg_.run.checkpoint_every > 0 && step % cfg_.run.checkpoint_every == 0;
    // What reads the step's outcome waits for its flags; other steps read them a step late.
    if (log_due || eval_due || checkpoint_due || settled.abandoned || stops_here()) settle();
    if (log_due) log_.train(s_.state.epoch);
    log_.progress(s_.state.epoch);
    if (eval_due) evaluate(s_.state.epoch);
    if (checkpoint_due) checkpoint();
    if (result_.reached_target) return false;
    return !stops_after();
  }

  // At an epoch's end (or the run's last step): the evaluation and checkpoint due at the end of
  // a whole epoch.
  void end_epoch() {
    // A run whose last step falls inside an epoch ends it unfinished: finish() evaluates then
    // (train.eval_at_end), not the epoch's end.
    const bool whole = s_.state.step_in_epoch == s_.parts.steps_per_epoch;
    if (cfg_.run.eval_every == 0 && whole && s_.state.last_eval_step != s_.state.step) {
      evaluate(s_.state.epoch);
    }
    // Resuming from the end of an epoch runs no step of it and goes on with the next.
    if (cfg_.run.checkpoint_every == 0 && whole) checkpoint();
  }

  bool reached_target() const { return result_.reached_target; }

  // The next step's batches. A data failure (a file unreadable or changed during training) ends
  // the run; a process alone first saves the steps trained since the last checkpoint (in a group
  // the other ranks could not take part in the save).
  std::vector<data::Batch> next(StepBatches& batches) {
    try {
      return batches.next();
    } catch (const data::DataError&) {
      log_.clear();
      if (!s_.parts.group && s_.state.step > 0) {
        try {
          checkpoint();
          s_.checkpointer.wait();
        } catch (const std::exception& e) {
          log::error(e.what());
        }
      }
      throw;
    }
  }

  // The evaluation at the end (unless stopped early) and the last checkpoint.
  FitResult finish() {
    settle();
    const auto& st = s_.state;
    if (!result_.stopped && cfg_.train.eval_at_end && st.last_eval_step != st.step) {
      evaluate(s_.parts.total_steps > 0 ? (st.step - 1) / s_.parts.steps_per_epoch : 0);
    }
    checkpoint();
    s_.checkpointer.wait();  // run.checkpoint_async: the last write done
    log_.clear();
    result_.steps = st.step;
    result_.first_step = std::max<int64_t>(s_.checkpointer.resumed_step(), 0);
    result_.seconds = log_.seconds();
    const std::string last = s_.checkpointer.last();  // a tag: absolute, as trainer.run_dir
    log_.finish(result_.stopped ? "KILLED" : "FINISHED",
                last.empty() ? last : std::filesystem::absolute(last).string());
    result_.host_reads_per_step = counts_.reads_per_step();
    result_.host_reads_outside_steps = counts_.reads_outside_steps();
    result_.ops_per_step = counts_.ops_per_step();
    return result_;
  }

 private:
  // One step, its failures explained: out of memory with the batch settings and the remedies; in
  // a group, any failure with the collective timeout as a possible cause.
  Settled train(const std::vector<data::Batch>& micro_batches) {
    const bool stop_requested = stop_ && stop_->load();
    if (!first_step_start_) first_step_start_ = std::chrono::steady_clock::now();
    try {
      log_.begin_step();
      counts_.begin_step();
      StepObserver* observer = profile_.before(s_.state.step + 1);
      Settled settled = s_.step->run(micro_batches, stop_requested, observer);
      profile_.after(s_.state.step, s_.parts.total_steps);
      counts_.end_step();
      log_.end_step();
      return settled;
    } catch (const c10::OutOfMemoryError& e) {
      log_.clear();
      const std::string snapshot = memory_.write();
      throw std::runtime_error(
          out_of_memory_message(s_.parts, s_.loaded, s_.state.step + 1, error_line(e), snapshot));
    } catch (const std::exception& e) {
      if (!s_.parts.group) throw;
      throw std::runtime_error(distributed::step_failure_line(s_.job.rank, s_.state.step + 1,
                                                              error_line(e), cfg_.dist.timeout_s));
    }
  }

  // The outcomes of the steps still in flight.
  void settle() {
    for (const auto& outcome : s_.step->settle()) take(outcome);
  }

  // A step's outcome as it reaches the host (counted in the state by the stepper): a finite loss
  // into the metrics window; an inf/NaN one warned about, and ending the run after
  // train.max_bad_steps in a row; a stop agreed by a group's ranks.
  void take(const StepOutcome& outcome) {
    if (outcome.step <= undone_through_) return;  // a step a rollback undid
    if (outcome.stop) stop_agreed_ = true;
    if (outcome.spike) warn_spike(outcome);
    if (!outcome.bad_loss) {
      log_.add(outcome);
      return;
    }
    if (cfg_.train.rollback_on_nan && roll_back(outcome)) return;
    const auto& st = s_.state;
    log_.clear();
    log::warn(strprintf("step %" PRId64 ": the loss is inf/NaN; update skipped (%" PRId64
                        " in a row, train.max_bad_steps %" PRId64 ")",
                        outcome.step, st.bad_steps_in_row, cfg_.train.max_bad_steps));
    if (st.bad_steps_in_row < cfg_.train.max_bad_steps) return;
    settle();
    checkpoint();
    s_.checkpointer.wait();
    throw std::runtime_error(strprintf(
        "the training loss was inf/NaN in %" PRId64 " steps in a row, steps %" PRId64 " to %" PRId64
        "; the model is as after step %" PRId64
        ", saved in %s; lower optim.lr, set train.clip_grad_norm, or use amp.dtype bfloat16",
        st.bad_steps_in_row, outcome.step - st.bad_steps_in_row + 1, outcome.step,
        outcome.step - st.bad_steps_in_row, s_.checkpointer.last().c_str()));
  }

  void warn_spike(const StepOutcome& o) {
    log_.clear();
    log::warn(strprintf("step %" PRId64
                        ": update skipped by train.skip_update_zscore (loss z-score %.2f, "
                        "gradient norm z-score %.2f; %" PRId64 " skipped so far)",
                        o.step, o.z_loss, o.z_grad_norm, s_.state.spike_skips));
  }

  // train.rollback_on_nan after the bad step `outcome`: back to the newest checkpoint not gone
  // back to yet, going on with the data after the steps queued so far. False when no checkpoint
  // was written yet; ends the run (throws) when train.max_rollbacks are spent, when the steps lost
  // since the last checkpoint written reach train.max_bad_steps, or when every kept checkpoint
  // was gone back to already.
  bool roll_back(const StepOutcome& outcome) {
    log_.clear();
    if (s_.checkpointer.saved_step() < 0) {
      log::warn(strprintf("step %" PRId64
                          ": the loss is inf/NaN and no checkpoint was written yet for "
                          "train.rollback_on_nan to go back to",
                          outcome.step));
      return false;
    }
    const auto& train = cfg_.train;
    if (s_.state.rollbacks >= train.max_rollbacks) {
      give_up(outcome, strprintf("after %" PRId64 " rollbacks (train.max_rollbacks %" PRId64 ")",
                                 s_.state.rollbacks, train.max_rollbacks));
    }
    s_.step->settle();  // the steps queued after the bad one are undone with it
    undone_through_ = s_.state.step;
    const int64_t back_to = s_.checkpointer.rollback();
    if (back_to < 0) {
      give_up(outcome, "with every kept checkpoint gone back to already");
    }
    log::warn(
        strprintf("step %" PRId64
                  ": the loss is inf/NaN; train.rollback_on_nan: back to the checkpoint of "
                  "step %" PRId64 ", the data of steps %" PRId64 " to %" PRId64
                  " skipped (rollback %" PRId64 " of this run; %" PRId64
                  " steps lost since the last checkpoint written, train.max_bad_steps %" PRId64 ")",
                  outcome.step, back_to, back_to + 1, undone_through_, s_.state.rollbacks,
                  s_.checkpointer.lost_steps(), train.max_bad_steps));
    if (s_.checkpointer.lost_steps() >= train.max_bad_steps) {
      give_up(outcome,
              strprintf("with %" PRId64
                        " steps lost since the last checkpoint written (train.max_bad_steps "
                        "%" PRId64 ")",
                        s_.checkpointer.lost_steps(), train.max_bad_steps));
    }
    return true;
  }

  // Ends a run whose rollbacks do not get it past the inf/NaN losses (exit 1); the checkpoints
  // stay as they are.
  [[noreturn]] void give_up(const StepOutcome& outcome, const std::string& why) {
    s_.checkpointer.wait();
    throw std::runtime_error(strprintf(
        "step %" PRId64
        ": the training loss is inf/NaN again %s; train.rollback_on_nan gives up. "
        "The checkpoints in %s are kept as they were; lower optim.lr, set train.clip_grad_norm, "
        "or use amp.dtype bfloat16",
        outcome.step, why.c_str(), (cfg_.run.dir + "/checkpoints").c_str()));
  }

  // Whether train.stop_at_step ends the run at this step.
  bool stops_here() const {
    return cfg_.train.stop_at_step > 0 && s_.state.step == cfg_.train.stop_at_step && steps_left();
  }

  // Whether the run stops after this step: a signal (agreed by a group's ranks in the steps'
  // flags; alone, at once) or train.stop_at_step.
  bool stops_after() {
    const bool stop_here = stops_here();
    const bool signalled = s_.parts.agreeing() ? stop_agreed_ : stop_ && stop_->load();
    if (!signalled && !stop_here) return false;
    settle();
    log_.clear();
    log::warn(strprintf("stopping after step %" PRId64 " (%s); resume with --resume auto",
                        s_.state.step, stop_here ? "train.stop_at_step" : "signal"));
    result_.stopped = true;
    return true;
  }

  void evaluate(int64_t epoch) {
    settle();
    log_.clear();
    const int64_t limit = cfg_.run.eval_batches;
    last_eval_ = result_.last_eval =
        engine::evaluate(s_.parts, s_.state.bad_samples, limit, log_.eval_progress("val"));
    s_.state.last_eval_step = s_.state.step;
    log_.eval(last_eval_, epoch);
    EvalResult ema;
    if (s_.average) {  // train.ema's average, with the model's buffers
      WeightAverage::Swapped swapped(*s_.average);
      int64_t seen = 0;  // its unreadable samples are the evaluation's above, counted there
      ema = engine::evaluate(s_.parts, seen, limit, log_.eval_progress("val_ema"));
      log_.eval(ema, epoch, "val_ema");
    }
    check_targets(s_.average ? &ema : nullptr);
  }

  // Ends the run when this evaluation reached a target of train.stop_at or train.stop_at_top1,
  // logging the time to it from the first step and from the process's start (MLPerf's run time).
  void check_targets(const EvalResult* ema) {
    for (const auto& target : targets_) {
      const auto value = eval_metric(target.metric, last_eval_, ema);
      if (!value || !target.reached_by(*value)) continue;
      result_.reached_target = true;
      const double from_start = seconds_since_process_start();
      result_.target_seconds =
          first_step_start_
              ? std::chrono::duration<double>(std::chrono::steady_clock::now() - *first_step_start_)
                    .count()
              : 0.0;
      result_.target_seconds_from_start = from_start;
      log::info(strprintf("%s %.6g reached %s (%s) at step %" PRId64
                          ": %.3f s from the first step, %.3f s from start-up; ending the run",
                          target.metric.c_str(), *value, target.key.c_str(),
                          target.describe().c_str(), s_.state.step, result_.target_seconds,
                          from_start));
      return;
    }
  }

  void checkpoint() {
    settle();
    s_.checkpointer.save(last_eval_);
  }

  Trainer::State& s_;
  const config::Config& cfg_;
  const std::atomic<bool>* stop_;
  MetricsLog log_;
  FitResult result_;
  EvalResult last_eval_;        // the latest evaluation, for the checkpoint of its step
  bool stop_agreed_ = false;    // a group's ranks agreed to stop (a step's flags)
  StepCounts counts_;           // host reads and operators of the steps
  ProfileWindow profile_;       // profile.start_step's window under the profiler
  MemoryHistory memory_;        // profile.memory_snapshot's allocator history
  int64_t undone_through_ = 0;  // the last step a rollback undid
  std::vector<StopTarget> targets_ = stop_targets(cfg_.train);  // train.stop_at, stop_at_top1
  std::optional<std::chrono::steady_clock::time_point> first_step_start_;  // this process's
};

}  // namespace

// Language models: the model FLOPs of a training sample (Trainer::train_flops: the forward and
// what its backward computes; under dist.tp_size a rank's share times the group's ranks) and the
// device's matrix-product rate in the compute dtype, measured as bench measures it once per run
// (engine/measure/run_peak.h: a resume reuses the run's), for the train records' MFU. Every rank
// must call this, in the same order (fsdp and tensor parallelism gather in the forward).
static void measure_utilisation(Trainer& trainer, Trainer::State& s, MetricsLog& log) {
  auto& p = s.parts;
  if (!p.splits.spec.sequence) return;
  const int64_t batch = s.loaded.cfg.data.batch_size;
  const double per_sample =
      static_cast<double>(trainer.train_flops()) * p.tp_size() / static_cast<double>(batch);
  const c10::ScalarType dtype = p.precision.autocast ? p.precision.dtype : torch::kFloat;
  const RunPeak peak =
      run_peak_tflops(s.loaded.cfg.run.dir, p.device, dtype,
                      /*resuming=*/s.checkpointer.resumed_step() >= 0, /*record=*/s.job.rank == 0);
  log.set_utilisation(per_sample, peak.tflops);
  if (s.job.rank != 0) return;
  log::info(strprintf("model FLOPs %.6g per sample; MFU against %.6g TFLOP/s, ", per_sample,
                      peak.tflops) +
            peak.note);
}

Trainer::Trainer(const config::LoadedConfig& loaded, const distributed::DistEnv& job, Build build)
    : s_(std::make_unique<State>(loaded, job, build)) {
  check_stop_target(loaded, s_->parts.splits.spec.sequence);
}

Trainer::~Trainer() = default;

FitResult Trainer::fit(const std::atomic<bool>* stop) {
  Run run(*s_, stop);
  measure_utilisation(*this, *s_, run.log());
  StepBatches batches(*s_->parts.train_loader, s_->state, s_->parts.steps_per_epoch,
                      s_->loaded.cfg.train.grad_accum_steps);
  while (run.steps_left()) {
    while (batches.has_step() && run.steps_left()) {
      if (!run.step(run.next(batches))) return run.finish();
    }
    run.end_epoch();
    if (run.reached_target()) break;
    batches.next_epoch();
  }
  return run.finish();
}

void Trainer::run_steps(int64_t steps, StepObserver& observer, bool fixed_batch) {
  auto& p = s_->parts;
  StepBatches batches(*p.train_loader, s_->state, p.steps_per_epoch,
                      s_->loaded.cfg.train.grad_accum_steps);
  std::vector<data::Batch> fixed;  // with fixed_batch: the first step's, on the device
  p.model->train();
  for (int64_t i = 0; i < steps; ++i) {
    if (!batches.has_step()) batches.next_epoch();
    observer.begin_step();
    if (fixed_batch && fixed.empty()) {
      fixed = batches.next();
      for (auto& b : fixed) {
        b.inputs = b.inputs.to(p.device);
        b.targets = b.targets.to(p.device);
      }
    }
    const auto& micro = fixed_batch ? fixed : batches.next();
    s_->step->run(micro, /*stop_requested=*/false, &observer);
    s_->after_step();
    observer.end_step(s_->step->last_loss());
  }
  s_->step->settle();
}

std::vector<std::string> Trainer::config_warnings() const {
  std::vector<std::string> out;
  const std::string warmup = warmup_warning(s_->loaded.cfg, s_->parts);
  if (!warmup.empty()) out.push_back(warmup);
  return out;
}

std::string Trainer::summary() const {
  const auto& cfg = s_->loaded.cfg;
  const auto& p = s_->parts;
  std::ostringstream out;
  out << "device: " << p.device.str() << "\n";
  if (p.group) {
    out << "distributed: rank " << s_->job.rank << " of " << s_->job.world_size << " ("
        << p.group->backend() << ", started by " << s_->job.source << "), "
        << (cfg.dist.strategy == "fsdp" ? "fsdp (parameters, gradients and optimizer state sharded)"
                                        : "ddp (replicated weights)")
        << (p.tp ? strprintf(" over %d data-parallel ranks, tensor parallel over %d",
                             p.data_parallel_size(), p.tp_size())
                 : std::string())
        << ", global batch "
        << cfg.data.batch_size * cfg.train.grad_accum_steps * p.data_parallel_size() << "\n";
  }
  out << "data: " << cfg.data.name << ", " << p.splits.train->size() << " train / "
      << p.splits.val->size() << " val samples, " << p.splits.spec.num_classes << " classes\n";
  out << "steps: " << p.total_steps << " (" << p.steps_per_epoch << " per epoch, batch "
      << cfg.data.batch_size << " x " << cfg.train.grad_accum_steps << " accumulation)\n";
  out << "precision: " << (cfg.amp.enabled ? cfg.amp.dtype + " autocast" : std::string("float32"))
      << (p.scaler ? " with gradient scaling" : "") << "\n";
  if (cfg.model.checkpointing != "none") {
    out << "activation checkpointing: " << cfg.model.checkpointing << "\n";
  }
  out << models::summary(*p.model, cfg.model.name);
  if (p.tp) {  // the summary counted this rank's parts
    int64_t whole = 0;
    for (const auto& [name, param] : models::unique_named_parameters(*p.model)) {
      whole += p.tp_plan.count(name) ? param.numel() * p.tp_size() : param.numel();
    }
    out << strprintf("parameters of the whole model: %" PRId64
                     " (above: this rank's parts of "
                     "the layers split over dist.tp_size %d)\n",
                     whole, p.tp_size());
  }
  return out.str();
}

bool Trainer::resume(const std::string& spec) {
  if (!s_->checkpointer.resume(spec)) return false;
  const int64_t stop_at = s_->loaded.cfg.train.stop_at_step;
  if (stop_at > 0 && stop_at < s_->state.step) {
    throw config::ConfigError({config::Issue{
        s_->loaded.where("train.stop_at_step"), "train.stop_at_step",
        "is " + std::to_string(stop_at) + " but the run resumes after step " +
            std::to_string(s_->state.step) + "; set it above that step, or 0 to train on"}});
  }
  return true;
}

std::string Trainer::last_checkpoint() const {
  return s_->checkpointer.last();
}

EvalResult Trainer::evaluate() {
  Progress bar(s_->job.rank == 0 ? s_->loaded.cfg.run.progress : "never");
  const auto r =
      engine::evaluate(s_->parts, s_->state.bad_samples, /*max_batches=*/0,
                       [&](int64_t done, int64_t total) { bar.evaluation("eval", done, total); });
  bar.clear();
  return r;
}

torch::nn::Module& Trainer::model() {
  return *s_->parts.model;
}

int Trainer::rank() const {
  return s_->job.rank;
}

int Trainer::world_size() const {
  return s_->parts.world_size();
}

int Trainer::data_parallel_size() const {
  return s_->parts.data_parallel_size();
}

torch::Device Trainer::device() const {
  return s_->parts.device;
}

const config::Config& Trainer::config() const {
  return s_->loaded.cfg;
}

int64_t Trainer::tokens_per_sample() const {
  const auto& spec = s_->parts.splits.spec;
  return spec.sequence ? spec.sample_shape.at(0) : 0;
}

}  // namespace trainer::engine
