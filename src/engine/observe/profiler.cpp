#include "engine/observe/profiler.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "engine/observe/profile_trace.h"
#include "util/format.h"

namespace trainer::engine {
namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// libkineto::ActivityType's values, as KinetoEvent::activityType() gives them.
constexpr uint8_t kCpuOp = 0, kUserAnnotation = 1, kMemcpy = 3, kMemset = 4, kKernel = 5;

ProfilerConfig config_of(const ProfileOptions& o) {
  return ProfilerConfig(ProfilerState::KINETO, /*report_input_shapes=*/o.record_shapes,
                        /*profile_memory=*/o.memory, /*with_stack=*/o.with_stack,
                        /*with_flops=*/false, /*with_modules=*/false);
}

std::set<ActivityType> activities_of(torch::Device device) {
  std::set<ActivityType> out{ActivityType::CPU};
  if (device.is_cuda()) out.insert(ActivityType::CUDA);
  return out;
}

// An ATen (or other dispatcher) operator, as engine::OpCount counts them: not an autograd node's
// range, not a named range.
bool is_operator(const prof::KinetoEvent& e) {
  if (e.activityType() != kCpuOp || e.scope() != 0) return false;
  const std::string name = e.name();
  return name.find("::") != std::string::npos && name.rfind("autograd::", 0) != 0 &&
         name.rfind("trainer::", 0) != 0;
}

bool on_device(const prof::KinetoEvent& e) {
  const auto a = e.activityType();
  return e.deviceType() != c10::DeviceType::CPU && (a == kKernel || a == kMemcpy || a == kMemset);
}

using Thread = std::vector<const prof::KinetoEvent*>;

// Each host thread's operators and ranges, and the device time of what each op launched (by
// its correlation id); device activity into `s`.
void split_events(const std::vector<prof::KinetoEvent>& events, ProfileSummary& s,
                  std::map<uint64_t, Thread>& threads, std::map<std::string, double>& kernels,
                  std::map<uint64_t, double>& device_us) {
  for (const auto& e : events) {
    if (e.name().rfind("ProfilerStep#", 0) == 0) continue;  // the step's range, not an operator
    if (on_device(e)) {
      const double us = static_cast<double>(e.durationNs()) / 1e3;
      kernels[e.name()] += us;
      s.cuda_us += us;
      device_us[e.linkedCorrelationId()] += us;
    } else if (e.deviceType() == c10::DeviceType::CPU &&
               (e.activityType() == kCpuOp || e.activityType() == kUserAnnotation)) {
      threads[e.startThreadId()].push_back(&e);
    }
  }
}

// One thread's events nested by their times (a stack): each one's own time into `ops`; returns
// the operators entered from no other operator.
int64_t nest(Thread& list, const std::map<uint64_t, double>& device_us,
             std::map<std::string, ProfiledOp>& ops) {
  std::stable_sort(list.begin(), list.end(), [](const auto* a, const auto* b) {
    return a->startNs() != b->startNs() ? a->startNs() < b->startNs() : a->endNs() > b->endNs();
  });
  struct Open {
    const prof::KinetoEvent* e;
    double child_us = 0;
  };
  std::vector<Open> stack;
  int operators_open = 0;
  int64_t top_level = 0;
  const auto close = [&] {
    const Open& o = stack.back();
    auto& op = ops[o.e->name()];
    op.name = o.e->name();
    const double us = static_cast<double>(o.e->durationNs()) / 1e3;
    ++op.calls;
    op.cpu_us += us;
    op.self_cpu_us += us - o.child_us;
    if (is_operator(*o.e)) --operators_open;
    stack.pop_back();
  };
  for (const auto* e : list) {
    while (!stack.empty() && stack.back().e->endNs() <= e->startNs()) close();
    if (!stack.empty()) stack.back().child_us += static_cast<double>(e->durationNs()) / 1e3;
    if (is_operator(*e) && operators_open++ == 0) ++top_level;
    const auto it = device_us.find(e->correlationId());
    if (it != device_us.end() && e->correlationId() != 0) ops[e->name()].self_cuda_us += it->second;
    stack.push_back({e});
  }
  while (!stack.empty()) close();
  return top_level;
}

ProfileSummary summarise(const std::vector<prof::KinetoEvent>& events, int64_t steps) {
  ProfileSummary s;
  s.steps = steps;
  const double per = steps > 0 ? 1.0 / static_cast<double>(steps) : 1.0;
  std::map<uint64_t, Thread> threads;
  std::map<std::string, double> kernels;
  std::map<uint64_t, double> device_us;
  split_events(events, s, threads, kernels, device_us);
  std::map<std::string, ProfiledOp> ops;
  int64_t top_level = 0;
  for (auto& [thread, list] : threads) top_level += nest(list, device_us, ops);
  for (auto& [name, op] : ops) {
    op.self_cpu_us *= per;
    op.cpu_us *= per;
    op.self_cuda_us *= per;
    s.ops.push_back(op);
  }
  std::sort(s.ops.begin(), s.ops.end(),
            [](const auto& a, const auto& b) { return a.self_cpu_us > b.self_cpu_us; });
  for (const auto& [name, us] : kernels) s.kernels.emplace_back(name, us * per);
  std::sort(s.kernels.begin(), s.kernels.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  s.cuda_us *= per;
  s.top_level_ops = static_cast<double>(top_level) * per;
  return s;
}

}  // namespace

std::string ProfileSummary::table(size_t rows) const {
  std::string out = strprintf("per step over %" PRId64
                              " profiled steps: %.0f ATen operators "
                              "(top level), %.3f ms of device time\n",
                              steps, top_level_ops, cuda_us / 1e3);
  out += strprintf("%-56s %9s %12s %12s %13s\n", "name", "calls", "self CPU us", "CPU us",
                   "self CUDA us");
  for (size_t i = 0; i < ops.size() && i < rows; ++i) {
    const auto& o = ops[i];
    out +=
        strprintf("%-56.56s %9.1f %12.1f %12.1f %13.1f\n", o.name.c_str(),
                  static_cast<double>(o.calls) / static_cast<double>(std::max<int64_t>(steps, 1)),
                  o.self_cpu_us, o.cpu_us, o.self_cuda_us);
  }
  if (!kernels.empty()) {
    out += strprintf("%-100s %12s\n", "kernel", "device us");
    for (size_t i = 0; i < kernels.size() && i < rows; ++i) {
      out += strprintf("%-100.100s %12.1f\n", kernels[i].first.c_str(), kernels[i].second);
    }
  }
  return out;
}

StepProfiler::StepProfiler(const ProfileOptions& options, torch::Device device)
    : options_(options), device_(device) {}

StepProfiler::~StepProfiler() {
  if (recording_) {
    try {
      prof::disableProfiler();
    } catch (...) {  // ending the process: nothing to report to
    }
  }
}

void StepProfiler::start() {
  // Without a CUDA device, Kineto's GPU probe (in a CUDA build) logs "gpuGetDeviceCount failed"
  // as an error on every trace, to stderr and into the trace. Its log level is read once, when
  // Kineto starts (the first profile of the process); a level the user set is kept.
  if (!at::globalContext().hasCUDA()) ::setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  const auto config = config_of(options_);
  const auto activities = activities_of(device_);
  // Kineto must be prepared before it is enabled.
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  recording_ = true;
}

ProfileSummary StepProfiler::stop(const std::string& trace_path, int64_t steps) {
  if (!recording_) throw std::logic_error("StepProfiler::stop without start");
  recording_ = false;
  auto result = prof::disableProfiler();
  const ProfileSummary summary = summarise(result->events(), steps);
  const std::string tmp = trace_path + ".tmp." + std::to_string(::getpid());
  try {
    result->save(tmp);
    std::ifstream in(tmp, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    in.close();
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << fix_trace_metadata(text.str(), trace_path);
    out.close();
    if (!out) throw std::runtime_error("writing " + tmp + " failed");
  } catch (const std::exception& e) {
    std::remove(tmp.c_str());
    throw std::runtime_error(trace_path + ": cannot write the trace: " + e.what());
  }
  if (std::rename(tmp.c_str(), trace_path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error(trace_path + ": cannot write the trace");
  }
  return summary;
}

struct PhaseRanges::Range {
  at::RecordFunction fn{at::RecordScope::USER_SCOPE};
};

PhaseRanges::PhaseRanges(StepObserver* inner, int64_t first_step)
    : inner_(inner), next_step_(first_step) {}
PhaseRanges::~PhaseRanges() = default;

void PhaseRanges::begin_step() {
  if (inner_) inner_->begin_step();
  range_.reset();
  step_range_.reset();
  step_name_ = "ProfilerStep#" + std::to_string(next_step_++);
  step_range_ = std::make_unique<Range>();
  if (step_range_->fn.isActive()) step_range_->fn.before(step_name_);
  begin(Phase::data);
}

void PhaseRanges::begin(Phase phase) {
  if (inner_ && phase != Phase::data) inner_->begin(phase);
  range_.reset();  // ends the phase before
  range_ = std::make_unique<Range>();
  if (range_->fn.isActive()) {
    static const char* const names[] = {"trainer::data", "trainer::forward", "trainer::backward",
                                        "trainer::grad_sync", "trainer::optimizer"};
    range_->fn.before(names[static_cast<int>(phase)]);
  }
}

void PhaseRanges::end_step(const torch::Tensor& loss) {
  range_.reset();
  step_range_.reset();
  if (inner_) inner_->end_step(loss);
}

}  // namespace trainer::engine
