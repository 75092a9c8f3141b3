#include "engine/flops.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

namespace trainer::engine {
namespace {

namespace prof = torch::profiler::impl;

// Operations whose FLOPs the profiler computes from their arguments (with_flops).
bool profiler_counts(const std::string& name) {
  static const std::set<std::string> kCounted = {"aten::mm", "aten::addmm", "aten::bmm",
                                                 "aten::baddbmm", "aten::conv2d"};
  return kCounted.count(name) > 0;
}

constexpr const char* kAttention = "aten::scaled_dot_product_attention";

// q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev]: q k^T and (attention) v.
int64_t attention_flops(const torch::autograd::profiler::KinetoEvent& e) {
  const auto shapes = e.shapes();
  if (shapes.size() < 3 || shapes[0].size() != 4 || shapes[1].size() != 4 ||
      shapes[2].size() != 4) {
    return 0;
  }
  const auto& q = shapes[0];
  const auto& k = shapes[1];
  const auto& v = shapes[2];
  const int64_t batch_heads = q[0] * q[1];
  return 2 * batch_heads * q[2] * k[2] * q[3] + 2 * batch_heads * q[2] * k[2] * v[3];
}

struct Counted {
  uint64_t thread, start, end;
  int64_t flops;
};

}  // namespace

int64_t count_flops(const std::function<void()>& fn) {
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO, /*report_input_shapes=*/true,
                                    /*profile_memory=*/false, /*with_stack=*/false,
                                    /*with_flops=*/true);
  const std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  // Kineto, the profiler's back end, logs its start-up (errors too on a machine without a GPU,
  // which CPU profiling does not need): quiet unless the user set a level.
  ::setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  try {
    fn();
  } catch (...) {
    torch::autograd::profiler::disableProfiler();
    throw;
  }
  const auto result = torch::autograd::profiler::disableProfiler();

  std::vector<Counted> counted;
  for (const auto& e : result->events()) {
    const std::string name = e.name();
    if (name == kAttention) {
      counted.push_back({e.startThreadId(), e.startNs(), e.endNs(), attention_flops(e)});
    } else if (profiler_counts(name)) {
      counted.push_back(
          {e.startThreadId(), e.startNs(), e.endNs(), static_cast<int64_t>(e.flops())});
    }
  }
  // Outermost first: by thread, then start, the longer of two equal starts first.
  std::sort(counted.begin(), counted.end(), [](const Counted& a, const Counted& b) {
    if (a.thread != b.thread) return a.thread < b.thread;
    if (a.start != b.start) return a.start < b.start;
    return a.end > b.end;
  });
  int64_t total = 0;
  const Counted* outer = nullptr;  // the enclosing counted operation of this thread, if any
  for (const auto& c : counted) {
    if (outer && outer->thread == c.thread && c.start >= outer->start && c.end <= outer->end) {
      continue;
    }
    outer = &c;
    total += c.flops;
  }
  return total;
}

}  // namespace trainer::engine
