#include "engine/observe/metrics.h"

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "engine/measure/memory.h"
#include "engine/observe/mlflow_run.h"
#include "engine/setup/objective.h"
#include "util/device.h"
#include "util/fileio.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::engine {

namespace {

// A rate with three significant digits below 100 ("0.0312", "12.0"), whole above.
std::string rate_text(double per_sec) {
  if (per_sec >= 99.95 || per_sec == 0.0) return strprintf("%.0f", per_sec);
  return strprintf("%#.3g", per_sec);
}

// A record as one JSON line. A number that is inf or NaN (the loss of a window whose every step
// had a bad loss, for one) is written as Python's json module writes it: NaN, Infinity,
// -Infinity, which Python's json and pandas read back as floats.
std::string json_line(const nlohmann::json& record) {
  std::string out = "{";
  for (auto it = record.begin(); it != record.end(); ++it) {
    if (out.size() > 1) out += ",";
    out += nlohmann::json(it.key()).dump() + ":";
    const auto& v = it.value();
    const double d = v.is_number_float() ? v.get<double>() : 0.0;
    if (std::isfinite(d)) {
      out += v.dump();
    } else {
      out += std::isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity";
    }
  }
  return out + "}";
}

// A line json_line wrote, parsed with its non-finite numbers as null.
nlohmann::json parse_line(std::string line) {
  for (const char* token : {":-Infinity", ":Infinity", ":NaN"}) {
    for (size_t at = line.find(token); at != std::string::npos; at = line.find(token, at)) {
      line.replace(at, std::strlen(token), ":null");
    }
  }
  return nlohmann::json::parse(line);
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& run_dir, bool tensorboard, int64_t resume_step,
                             bool evaluated_at_resume, bool csv) {
  const auto path = std::filesystem::path(run_dir) / "metrics.jsonl";
  std::vector<nlohmann::json> kept_records;  // for metrics.csv
  if (resume_step >= 0) {
    // Lines past the checkpoint's step will be written again by the resumed run.
    std::string kept;
    std::ifstream in(path);
    int64_t reached = resume_step;  // the last step the log had trained to
    for (std::string line; std::getline(in, line);) {
      try {
        const auto j = parse_line(line);
        const int64_t step = j.at("step").get<int64_t>();
        const bool val = j.at("split").get<std::string>().rfind("val", 0) == 0;  // val_ema too
        if (!val) reached = std::max(reached, step);
        if (step < resume_step || (step == resume_step && (!val || evaluated_at_resume))) {
          kept += line + "\n";
          if (csv) kept_records.push_back(j);
        }
      } catch (const nlohmann::json::exception&) {
        // A line cut short by a crash.
      }
    }
    write_text_atomically(path.string(), kept);
    if (reached > resume_step) {
      log::info(strprintf("resumed at step %" PRId64
                          ": the run had logged training to step %" PRId64 ", so %" PRId64
                          " steps trained since that checkpoint are lost and train again",
                          resume_step, reached, reached - resume_step));
    }
  }
  out_.open(path, std::ios::out | (resume_step >= 0 ? std::ios::app : std::ios::trunc));
  if (!out_) throw std::runtime_error(path.string() + ": cannot open for writing");
  if (tensorboard) {
    events_ = std::make_unique<tensorboard::EventWriter>(
        (std::filesystem::path(run_dir) / "tb").string());
  }
  if (csv) {
    csv_ =
        std::make_unique<CsvLog>((std::filesystem::path(run_dir) / "metrics.csv").string(),
                                 std::vector<std::string>{"split", "step", "epoch"}, kept_records);
  }
}

MetricsWriter::~MetricsWriter() = default;

void MetricsWriter::finish(const std::string& status, const std::string& last_checkpoint) {
  if (!mlflow_) return;
  if (!last_checkpoint.empty()) mlflow_->set_tag("trainer.last_checkpoint", last_checkpoint);
  // Stopped early (a signal under a launcher's grace period, or train.stop_at_step): a short wait.
  mlflow_->finish(status, status == "KILLED" ? 2.0 : 10.0);
}

void MetricsWriter::write(const nlohmann::json& record) {
  out_ << json_line(record) << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("writing metrics failed (disk full?)");
  if (csv_) csv_->write(record);
  const double wall_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (mlflow_) mlflow_->log(tracking::record_metrics(record, std::llround(wall_time * 1e3)));
  if (!events_) return;
  const std::string split = record.at("split").get<std::string>();
  const int64_t step = record.at("step").get<int64_t>();
  for (const auto& [key, value] : record.items()) {
    if (key == "split" || key == "step" || key == "epoch" || !value.is_number()) continue;
    const std::string tag = key == "lr" ? key : split + "/" + key;
    events_->scalar(tag, value.get<double>(), step, wall_time);
  }
}

Progress::Progress(const std::string& mode)
    : active_(mode == "always" || (mode == "auto" && isatty(STDERR_FILENO))) {}

void Progress::update(int64_t step, int64_t total_steps, int64_t epoch, double loss,
                      double samples_per_sec, double eta_seconds) {
  if (!active_ || !due(step == total_steps)) return;
  constexpr int kWidth = 24;
  const double frac = total_steps > 0 ? static_cast<double>(step) / total_steps : 0.0;
  const int filled = static_cast<int>(std::lround(frac * kWidth));
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  // Before the first log line there is no loss to show yet.
  const std::string loss_text = std::isfinite(loss) ? strprintf("%.4f", loss) : "-";
  std::fprintf(stderr,
               "\r\033[Kepoch %" PRId64 " [%s] %" PRId64 "/%" PRId64 " loss %s %s samples/s ETA %s",
               epoch, bar.c_str(), step, total_steps, loss_text.c_str(),
               rate_text(samples_per_sec).c_str(), format_duration(eta_seconds).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

bool Progress::due(bool last) {
  const auto now = std::chrono::steady_clock::now();
  if (!last && drawn_ && now - last_draw_ < std::chrono::milliseconds(200)) return false;
  last_draw_ = now;
  return true;
}

void Progress::evaluation(const std::string& what, int64_t done, int64_t total) {
  if (!active_ || !due(done == total)) return;
  constexpr int kWidth = 24;
  const double frac = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 0.0;
  std::string bar(static_cast<size_t>(std::lround(frac * kWidth)), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r\033[K%s [%s] %" PRId64 "/%" PRId64 " batches", what.c_str(), bar.c_str(),
               done, total);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::clear() {
  if (!active_ || !drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) seconds = 0;
  const auto total = static_cast<long long>(std::llround(seconds));
  const long long h = total / 3600, m = (total / 60) % 60, s = total % 60;
  char buf[32];
  if (h > 0) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", h, m, s);
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", m, s);
  }
  return buf;
}

}  // namespace trainer::engine

namespace trainer::engine {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

MetricsLog::MetricsLog(const config::Config& cfg, Components& parts, TrainingState& state, int rank,
                       int64_t resumed_step)
    : cfg_(cfg),
      parts_(parts),
      state_(state),
      progress_(rank == 0 ? cfg.run.progress : "never"),
      start_(Clock::now()),
      window_start_(start_),
      first_step_(state.step) {
  if (rank == 0) {
    const bool evaluated = resumed_step >= 0 && state.last_eval_step == resumed_step;
    writer_ = std::make_unique<MetricsWriter>(cfg.run.dir, cfg.run.tensorboard, resumed_step,
                                              evaluated, cfg.tracking.csv);
    writer_->track(start_mlflow(cfg, resumed_step >= 0));
  }
  if (parts.device.is_cuda()) {
    cuda_index_ = parts.device.has_index() ? parts.device.index() : 0;
    std::string why;
    gpu_ = GpuMonitor::open(cuda_index_, &why);
    if (!gpu_) log::info("GPU monitoring off: " + why);
  }
}

void MetricsLog::count(const std::vector<data::Batch>& micro_batches) {
  for (const auto& b : micro_batches) {
    state_.window_samples += b.targets.size(0);
    state_.bad_samples += b.bad_samples;
  }
}

void MetricsLog::begin_step() {
  if (parts_.device.is_cuda()) reset_cuda_peak(cuda_index_);
}

void MetricsLog::end_step() {
  if (parts_.device.is_cuda()) {
    window_cuda_peak_ = std::max(window_cuda_peak_, cuda_memory(cuda_index_).peak);
  }
}

void MetricsLog::add(const StepOutcome& /*outcome*/) {
  ++state_.window_steps;  // its loss is in window_loss already (the step adds it on the device)
}

void MetricsLog::finish(const std::string& status, const std::string& last_checkpoint) {
  if (writer_) writer_->finish(status, last_checkpoint);
}

double MetricsLog::seconds() const {
  return seconds_since(start_);
}

double MetricsLog::eta() const {
  return seconds() / static_cast<double>(state_.step - first_step_) *
         static_cast<double>(parts_.total_steps - state_.step);
}

MetricsLog::WindowSums MetricsLog::window_sums() {
  const double samples = static_cast<double>(state_.window_samples);
  const bool norms = state_.window_grad_norm.defined();
  if (parts_.group || norms) {  // the mean loss (and gradient norm) and the samples of every rank
    auto sums = torch::stack({state_.window_loss.to(torch::kDouble),
                              torch::full_like(state_.window_loss, samples, torch::kDouble),
                              norms ? state_.window_grad_norm.to(torch::kDouble)
                                    : torch::zeros_like(state_.window_loss, torch::kDouble)});
    const double ranks = parts_.group ? parts_.group->world_size() : 1;
    if (parts_.group) parts_.group->all_reduce({sums}, distributed::Reduce::sum);
    const auto host = read_to_host(sums);
    const auto s = host.accessor<double, 1>();
    // The ranks of a tensor-parallel group train on the same samples.
    return {s[0] / ranks, s[1] / parts_.tp_size(), s[2] / ranks};
  }
  return {state_.window_steps > 0 ? host_double(state_.window_loss) : 0.0, samples, 0.0};
}

void MetricsLog::train(int64_t epoch) {
  const double seconds = seconds_since(window_start_);
  const auto [loss_sum, samples, grad_norm_sum] = window_sums();
  // NAN when every step of the window had a bad loss (and was skipped).
  last_loss_ = state_.window_steps > 0 ? loss_sum / static_cast<double>(state_.window_steps) : NAN;
  last_sps_ = seconds > 0 ? samples / seconds : 0.0;
  const double lr = parts_.schedule->lr(std::max<int64_t>(state_.updates() - 1, 0));
  if (state_.window_steps > 0 && !std::isfinite(last_loss_)) {  // train.max_bad_steps: 0
    clear();
    throw std::runtime_error("the training loss is " + std::to_string(last_loss_) + " at step " +
                             std::to_string(state_.step) +
                             "; lower optim.lr or set train.clip_grad_norm");
  }
  nlohmann::json record = {
      {"split", "train"}, {"step", state_.step},          {"epoch", epoch},
      {"lr", lr},         {"samples_per_sec", last_sps_}, {"bad_samples", state_.bad_samples}};
  record["loss"] = last_loss_;  // NaN when every step of the window had a bad loss
  if (parts_.scaler) record["loss_scale"] = parts_.scaler->scale_value();
  if (parts_.scaler || state_.skipped_steps > 0) record["skipped_steps"] = state_.skipped_steps;
  if (cfg_.train.skip_update_zscore.enabled()) record["spike_skips"] = state_.spike_skips;
  if (state_.rollbacks > 0) record["rolled_back_steps"] = state_.rolled_back_steps;
  if (state_.window_grad_norm.defined() && state_.window_steps > 0) {
    record["grad_norm"] = grad_norm_sum / static_cast<double>(state_.window_steps);
  }
  std::string line = strprintf(
      "step %" PRId64 "/%" PRId64 " epoch %" PRId64 " loss %.4f lr %.3g %s samples/s", state_.step,
      parts_.total_steps, epoch, last_loss_, lr, rate_text(last_sps_).c_str());
  const auto& spec = parts_.splits.spec;
  if (spec.sequence && !spec.sample_shape.empty()) {  // a language model: T tokens per sample
    const double tokens_per_sec = last_sps_ * static_cast<double>(spec.sample_shape[0]);
    record["tokens_per_sec"] = tokens_per_sec;
    line += " " + rate_text(tokens_per_sec) + " tokens/s";
  }
  if (flops_per_sample_ > 0 && peak_tflops_ > 0) {  // every rank drives one device
    const double devices = parts_.group ? parts_.group->world_size() : 1;
    const double tflops = flops_per_sample_ * last_sps_ / devices / 1e12;
    record["tflops"] = tflops;
    record["mfu"] = tflops / peak_tflops_;
    record["peak_tflops"] = peak_tflops_;
    line += strprintf(" MFU %.3g%%", 100.0 * tflops / peak_tflops_);
  }
  line += " ETA " + format_duration(eta());
  add_gpu_readings(record, line);
  if (parts_.objective) {  // train.objective's metrics (dpo: TRL's names, over the global batch)
    for (const auto& [name, value] : parts_.objective->take_window()) record[name] = value;
  }
  if (writer_) writer_->write(record);
  clear();  // the line above the bar, which the next step redraws
  log::info(line);
  state_.window_steps = state_.window_samples = 0;
  state_.window_loss.zero_();
  if (state_.window_grad_norm.defined()) state_.window_grad_norm.zero_();
  window_start_ = Clock::now();
}

void MetricsLog::add_gpu_readings(nlohmann::json& record, std::string& line) {
  if (parts_.device.is_cuda()) {  // the caching allocator's view: what this process's tensors took
    record["cuda_peak_mb"] = static_cast<double>(window_cuda_peak_) / kMiB;
    record["cuda_reserved_mb"] = static_cast<double>(cuda_memory(cuda_index_).reserved) / kMiB;
    line += strprintf(" | peak %.0f MiB", static_cast<double>(window_cuda_peak_) / kMiB);
    window_cuda_peak_ = 0;
  }
  if (const auto g = gpu_ ? gpu_->sample() : std::nullopt) {
    record["gpu_util"] = g->util_pct;
    record["gpu_mem_mb"] = g->mem_used_mb;
    record["gpu_temp_c"] = g->temp_c;
    record["gpu_power_w"] = g->power_w;
    line += strprintf(" | GPU %.0f%% %.0f/%.0f MiB %.0f C %.0f W", g->util_pct, g->mem_used_mb,
                      g->mem_total_mb, g->temp_c, g->power_w);
  }
}

void MetricsLog::eval(const EvalResult& e, int64_t epoch, const std::string& split) {
  clear();
  nlohmann::json record = {
      {"split", split}, {"step", state_.step}, {"epoch", epoch}, {"loss", e.loss}};
  std::string line = strprintf("%s step %" PRId64 " epoch %" PRId64 ": loss %.4f",
                               split == "val" ? "eval" : "eval (ema)", state_.step, epoch, e.loss);
  if (!e.objective.empty()) {  // train.objective's metrics (dpo: TRL's names, over the split)
    for (const auto& [name, value] : e.objective) {
      record[name] = value;
      if (name == "rewards/accuracies") line += strprintf(" %s %.4f", name.c_str(), value);
    }
    line += strprintf(" (%" PRId64 " pairs)", e.samples);
  } else if (e.sequence) {
    record["ppl"] = e.ppl;
    line += strprintf(" ppl %.3f (%" PRId64 " tokens)", e.ppl, e.samples);
  } else {
    record["top1"] = e.top1;
    record["top5"] = e.top5;
    line += strprintf(" top1 %.2f%% top5 %.2f%% (%" PRId64 " samples)", 100.0 * e.top1,
                      100.0 * e.top5, e.samples);
  }
  if (writer_) writer_->write(record);
  log::info(line);
}

void MetricsLog::first_step_line(int64_t epoch) {
  const int64_t step = state_.step;
  if (step != first_step_ + 1 || cfg_.run.log_every <= 1 || step % cfg_.run.log_every == 0 ||
      step == parts_.total_steps) {
    return;
  }
  log::info(strprintf("step %" PRId64 "/%" PRId64 " epoch %" PRId64
                      ": first step in %.1f s, ETA %s (train lines every %" PRId64 " steps)",
                      step, parts_.total_steps, epoch, seconds_since(start_),
                      format_duration(eta()).c_str(), cfg_.run.log_every));
}

void MetricsLog::progress(int64_t epoch) {
  if (!progress_.active()) return first_step_line(epoch);
  // Before the first train record: this process's samples since the start, times the
  // data-parallel ranks (a tensor-parallel group's ranks share their samples).
  double sps = last_sps_;
  const double seconds = seconds_since(window_start_);
  if (window_start_ == start_ && state_.step > first_step_ && seconds > 0) {
    const double ranks = parts_.group ? parts_.group->world_size() / parts_.tp_size() : 1;
    sps = static_cast<double>(state_.window_samples) * static_cast<double>(ranks) / seconds;
  }
  progress_.update(state_.step, parts_.total_steps, epoch, last_loss_, sps, eta());
}

}  // namespace trainer::engine
