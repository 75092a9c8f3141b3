#include "engine/observe/profile_window.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include "util/format.h"
#include "util/log.h"

namespace trainer::engine {

ProfileWindow::ProfileWindow(const config::ProfileConfig& cfg, torch::Device device,
                             std::string run_dir, int rank)
    : cfg_(cfg), device_(device), run_dir_(std::move(run_dir)), rank_(rank) {}

ProfileWindow::~ProfileWindow() {
  if (!profiler_ || !profiler_->recording()) return;
  try {
    ranges_.reset();  // a step cut short: its ranges end before the profiler stops
    stop(std::max(last_ended_, first_));
  } catch (const std::exception& e) {
    log::error(std::string("profile: ") + e.what());
  }
}

StepObserver* ProfileWindow::before(int64_t step) {
  if (cfg_.start_step <= 0) return nullptr;
  const bool in_window = step >= cfg_.start_step && step < cfg_.start_step + cfg_.steps;
  if (!profiler_ && in_window) {
    ProfileOptions options;
    options.record_shapes = cfg_.record_shapes;
    options.with_stack = cfg_.with_stack;
    options.memory = cfg_.memory;
    profiler_ = std::make_unique<StepProfiler>(options, device_);
    ranges_ = std::make_unique<PhaseRanges>(nullptr, step);
    first_ = step;
    profiler_->start();
  }
  if (!profiler_ || !profiler_->recording()) return nullptr;
  ranges_->begin_step();
  return ranges_.get();
}

void ProfileWindow::after(int64_t step, int64_t last_step) {
  if (!checked_ && cfg_.start_step > last_step && rank_ == 0) {
    log::warn(strprintf("profile.start_step %" PRId64 " is after the run's last step %" PRId64
                        ": nothing will be profiled; set it to a step up to %" PRId64,
                        cfg_.start_step, last_step, last_step));
  }
  checked_ = true;
  if (!profiler_ || !profiler_->recording()) return;
  ranges_->end_step(torch::Tensor());
  last_ended_ = step;
  if (step >= cfg_.start_step + cfg_.steps - 1 || step >= last_step) stop(step);
}

void ProfileWindow::stop(int64_t step) {
  const auto dir = std::filesystem::path(run_dir_) / "profile";
  std::filesystem::create_directories(dir);
  const std::string name =
      "rank_" + std::to_string(rank_) +
      (first_ == cfg_.start_step ? "" : ".from_step_" + std::to_string(first_)) + ".trace.json";
  const std::string trace = (dir / name).string();
  const int64_t steps = step - first_ + 1;
  const ProfileSummary summary = profiler_->stop(trace, steps);
  if (rank_ != 0) return;
  log::info(strprintf("profiled steps %" PRId64 " to %" PRId64 " (profile.start_step, "
                      "profile.steps): %s; the operators by self time, per step:\n%s",
                      first_, step, trace.c_str(), summary.table().c_str()));
}

}  // namespace trainer::engine
