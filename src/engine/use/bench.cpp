#include "engine/use/bench.h"

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <sys/resource.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "engine/measure/memory.h"
#include "engine/measure/op_count.h"
#include "engine/observe/profiler.h"
#include "engine/setup/components.h"
#include "nn/activation_checkpoint.h"
#include "util/device.h"
#include "util/format.h"
#include "util/gpu_monitor.h"
#include "util/log.h"

namespace trainer::engine {

void synchronize(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : 0);
}

namespace {

using Clock = std::chrono::steady_clock;

int cuda_index(torch::Device device) {
  return device.has_index() ? device.index() : 0;
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
  }
  return "CPU";
}

// The q-quantile of sorted `v` with linear interpolation between ranks (NumPy's default).
double quantile(const std::vector<double>& v, double q) {
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

// Marks where each timed step and phase begins: CUDA events recorded on the device's current
// stream on a GPU (read once, after the last step), the steady clock on the CPU.
class PhaseTimer final : public StepObserver {
 public:
  PhaseTimer(torch::Device device, int64_t warmup) : device_(device), warmup_(warmup) {}

  void begin_step() override {
    if (step_ == warmup_) {  // the first timed step: the warm-up's work finished first
      synchronize(device_);
      if (device_.is_cuda()) reset_cuda_peak(cuda_index(device_));
      if (on_timed_start) on_timed_start();
      wall_start_ = Clock::now();
    }
    if (step_ >= warmup_) mark(static_cast<int>(Phase::data));
  }
  void begin(Phase phase) override {
    if (step_ >= warmup_) mark(static_cast<int>(phase));
  }
  void end_step(const torch::Tensor& loss) override {
    if (step_ >= warmup_) {
      mark(kEnd);
      loss_ = loss;
    }
    ++step_;
  }

  std::function<void()> on_timed_start;  // called as the first timed step begins

  // After the last step: waits for the device, then fills the timing fields of `r`.
  void finish(BenchResult& r) {
    synchronize(device_);
    r.seconds = std::chrono::duration<double>(Clock::now() - wall_start_).count();
    std::vector<double> steps;
    double step_ms = 0;
    for (size_t i = 0; i + 1 < marks_.size(); ++i) {
      if (marks_[i].phase == kEnd) {
        steps.push_back(step_ms);
        step_ms = 0;
        continue;
      }
      const double ms =
          device_.is_cuda()
              ? marks_[i].event->elapsedTime(*marks_[i + 1].event)
              : std::chrono::duration<double, std::milli>(marks_[i + 1].host - marks_[i].host)
                    .count();
      r.phase_ms[static_cast<size_t>(marks_[i].phase)] += ms;
      step_ms += ms;
    }
    steps.push_back(step_ms);  // the last step's end is the last mark
    for (size_t i = 0; i < steps.size(); ++i) {
      log::debug(strprintf("bench: timed step %zu took %.2f ms", i + 1, steps[i]));
    }
    const auto n = static_cast<double>(steps.size());
    for (auto& ms : r.phase_ms) ms /= n;
    double sum = 0;
    for (double ms : steps) sum += ms;
    std::sort(steps.begin(), steps.end());
    r.step_ms = {sum / n, quantile(steps, 0.5), quantile(steps, 0.9), steps.back()};
    r.final_loss = host_double(loss_);
  }

 private:
  static constexpr int kEnd = kPhaseCount;  // a step's end
  struct Mark {
    int phase;                        // a Phase, or kEnd
    Clock::time_point host;           // on the CPU
    std::optional<c10::Event> event;  // on a GPU
  };

  void mark(int phase) {
    Mark m{phase, Clock::now(), std::nullopt};
    if (device_.is_cuda()) {
      m.event.emplace(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
      m.event->record(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device_));
    }
    marks_.push_back(std::move(m));
  }

  torch::Device device_;
  int64_t warmup_;
  int64_t step_ = 0;
  Clock::time_point wall_start_;
  std::vector<Mark> marks_;
  torch::Tensor loss_;
};

}  // namespace

namespace {

// Attributes each phase's operators to its bucket of BenchResult::ops_per_step.
class PhaseCounter final : public StepObserver {
 public:
  explicit PhaseCounter(OpCount& count) : count_(count) {}
  void begin_step() override { count_.set_phase("other"); }
  void begin(Phase phase) override {
    const bool own =
        phase == Phase::forward || phase == Phase::backward || phase == Phase::optimizer;
    count_.set_phase(own ? phase_name(phase) : "other");
  }
  void end_step(const torch::Tensor& /*loss*/) override { count_.set_phase("other"); }

 private:
  OpCount& count_;
};

// Runs `steps` more training steps, counting their operators and host reads.
void count_operators(Trainer& trainer, const BenchOptions& options, BenchResult& r) {
  if (options.counted <= 0) return;
  OpCount count;
  PhaseCounter phases(count);
  trainer.run_steps(options.counted, phases, options.fixed_batch);
  synchronize(trainer.device());
  const auto n = static_cast<double>(options.counted);
  double total = 0;
  for (const char* phase : {"forward", "backward", "optimizer", "other"}) {
    const auto by_phase = count.by_phase();
    const auto it = by_phase.find(phase);
    r.ops_per_step[phase] = it == by_phase.end() ? 0.0 : static_cast<double>(it->second) / n;
    total += r.ops_per_step[phase];
  }
  r.ops_per_step["total"] = total;
  for (const auto& [phase, names] : count.by_phase_and_name()) {
    for (const auto& [name, c] : names) r.ops_by_name[phase][name] = static_cast<double>(c) / n;
  }
  r.host_syncs_per_step = static_cast<double>(count.host_syncs()) / n;
}

// Runs options.profiled more steps under the Kineto profiler, writing its trace.
void profile_steps(Trainer& trainer, const BenchOptions& options, BenchResult& r) {
  if (options.profile_dir.empty() || options.profiled <= 0) return;
  ProfileOptions p;
  p.record_shapes = options.profile_shapes;
  StepProfiler profiler(p, trainer.device());
  PhaseRanges ranges;
  synchronize(trainer.device());
  profiler.start();
  trainer.run_steps(options.profiled, ranges, options.fixed_batch);
  synchronize(trainer.device());
  r.profile_trace = options.profile_dir + "/rank_" + std::to_string(trainer.rank()) + ".trace.json";
  const auto summary = profiler.stop(r.profile_trace, options.profiled);
  r.profile_table = summary.table();
  r.profiled_ops_per_step = summary.top_level_ops;
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::data:
      return "data";
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::grad_sync:
      return "grad_sync";
    case Phase::optimizer:
      return "optimizer";
  }
  return "?";
}

std::string device_name(torch::Device device) {
  if (!device.is_cuda()) return cpu_name();
  std::string why;
  const auto monitor = GpuMonitor::open(cuda_index(device), &why);
  const std::string name = monitor ? monitor->name() : "";
  return name.empty() ? device.str() : name;
}

BenchResult run_bench(Trainer& trainer, const BenchOptions& options) {
  const auto& cfg = trainer.config();
  const torch::Device device = trainer.device();
  BenchResult r;
  r.device_name = device_name(device);
  r.flops_per_step = 3 * trainer.forward_flops() * cfg.train.grad_accum_steps;

  PhaseTimer timer(device, options.warmup);
  distributed::CommBytes communicated;  // before the timed steps
  int64_t offloaded = 0;                // likewise
  timer.on_timed_start = [&] {
    communicated = trainer.communicated();
    offloaded = nn::offloaded_bytes();
  };
  trainer.run_steps(options.warmup + options.steps, timer, options.fixed_batch);
  timer.finish(r);
  r.activation_offload_bytes_per_step =
      (nn::offloaded_bytes() - offloaded) / std::max<int64_t>(options.steps, 1);
  r.held = trainer.held_state();
  const auto moved = trainer.communicated() - communicated;
  const auto per_step = [&](int64_t bytes) {
    return static_cast<double>(bytes) / static_cast<double>(std::max<int64_t>(options.steps, 1));
  };
  r.comm_bytes_per_step = per_step(moved.total());
  r.comm_by_kind = {{"all_reduce", per_step(moved.all_reduce)},
                    {"all_gather", per_step(moved.all_gather)},
                    {"reduce_scatter", per_step(moved.reduce_scatter)},
                    {"broadcast", per_step(moved.broadcast)}};
  count_operators(trainer, options, r);
  profile_steps(trainer, options, r);

  const double samples =
      static_cast<double>(options.steps * cfg.data.batch_size * cfg.train.grad_accum_steps *
                          trainer.data_parallel_size());
  r.samples_per_sec = samples / r.seconds;
  r.tokens_per_sec = r.samples_per_sec * static_cast<double>(trainer.tokens_per_sample());
  if (device.is_cuda()) {
    r.peak_memory_mb = static_cast<double>(cuda_memory(cuda_index(device)).peak) / (1 << 20);
    r.peak_memory_kind = "cuda_allocator";
  } else {
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    r.peak_memory_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
    r.peak_memory_kind = "cpu_rss";
  }
  const c10::ScalarType dtype = cfg.amp.enabled ? dtype_named(cfg.amp.dtype) : torch::kFloat32;
  r.tflops = static_cast<double>(r.flops_per_step) / (r.step_ms.mean / 1e3) / 1e12;
  r.peak_tflops = matmul_peak_tflops(device, dtype);
  r.mfu = r.peak_tflops > 0 ? r.tflops / r.peak_tflops : 0.0;
  return r;
}

}  // namespace trainer::engine
