#include "engine/measure/flops.h"

#include <ATen/record_function.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "nn/aligned_linear.h"

namespace trainer::engine {
namespace {

// Counted operations and how to count them from their arguments and results.
enum class Kind { none, matmul, addmm, linear, conv, attention };

Kind kind_of(const char* name) {
  static const std::pair<const char*, Kind> kinds[] = {
      {"aten::mm", Kind::matmul},
      {"aten::bmm", Kind::matmul},
      {"aten::addmm", Kind::addmm},
      {"aten::baddbmm", Kind::addmm},
      {nn::kAlignedLinear, Kind::linear},
      {"aten::conv2d", Kind::conv},
      {"aten::scaled_dot_product_attention", Kind::attention}};
  for (const auto& [n, k] : kinds) {
    if (std::strcmp(name, n) == 0) return k;
  }
  return Kind::none;
}

std::vector<int64_t> sizes_of(const c10::IValue& v) {
  if (!v.isTensor() || !v.toTensor().defined()) return {};
  const auto s = v.toTensor().sizes();
  return {s.begin(), s.end()};
}

// 2 per multiply-add: a [.., n, k] by a [.., k, m] product (batched: the leading sizes of a).
int64_t product_flops(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.size() < 2 || b.size() < 2) return 0;
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < a.size(); ++i) batch *= a[i];
  return 2 * batch * a[a.size() - 2] * a.back() * b.back();
}

// The shapes an operation was called with, kept from its start to its end.
struct Shapes : at::ObserverContext {
  Kind kind = Kind::none;
  std::vector<std::vector<int64_t>> inputs;
  std::vector<bool> grads;  // which inputs require gradients (count_train_flops only)
};

// The operations the backward of operation `s` computes, in halves of its forward's: two for
// each differentiated operand of a product; attention's dV, dP, dQ and dK one each.
int64_t backward_halves(const Shapes& s) {
  const auto& g = s.grads;
  const auto at = [&](size_t i) { return i < g.size() && g[i]; };
  switch (s.kind) {
    case Kind::matmul:
    case Kind::linear:
    case Kind::conv:
      return 2 * (at(0) + at(1));
    case Kind::addmm:
      return 2 * (at(1) + at(2));
    case Kind::attention:
      return at(2) + (at(0) || at(1)) + at(0) + at(1);
    case Kind::none:
      break;
  }
  return 0;
}

int64_t flops_of(const Shapes& s, const at::RecordFunction& fn) {
  const auto& in = s.inputs;
  switch (s.kind) {
    case Kind::matmul:
      return in.size() >= 2 ? product_flops(in[0], in[1]) : 0;
    case Kind::addmm:
      return in.size() >= 3 ? product_flops(in[1], in[2]) : 0;
    case Kind::linear: {  // x [..., C] by weight [V, C]
      if (in.size() < 2 || in[0].empty() || in[1].size() != 2) return 0;
      int64_t rows = 1;
      for (size_t i = 0; i + 1 < in[0].size(); ++i) rows *= in[0][i];
      return 2 * rows * in[1][1] * in[1][0];
    }
    case Kind::conv: {  // out [N, Cout, H, W] x weight [Cout, Cin/groups, kh, kw]
      const auto outputs = fn.outputs();
      if (in.size() < 2 || outputs.empty()) return 0;
      const auto& w = in[1];
      const auto out = sizes_of(outputs[0]);
      if (w.size() != 4 || out.size() != 4) return 0;
      return 2 * out[0] * out[1] * out[2] * out[3] * w[1] * w[2] * w[3];
    }
    case Kind::attention: {  // q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev]
      if (in.size() < 3) return 0;
      const auto &q = in[0], &k = in[1], &v = in[2];
      if (q.size() != 4 || k.size() != 4 || v.size() != 4) return 0;
      return 2 * q[0] * q[1] * q[2] * k[2] * q[3] + 2 * q[0] * q[1] * q[2] * k[2] * v[3];
    }
    case Kind::none:
      break;
  }
  return 0;
}

// The live count: one per process; counted operations on this thread only.
std::atomic<int64_t*> total{nullptr};
thread_local int open_counted = 0;        // counted operations entered and not left on this thread
thread_local bool with_backward = false;  // count_train_flops: the backward's products too

// Inputs can be read only when an operation starts, results only when it ends.
std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
  const Kind kind = kind_of(fn.name());
  if (kind == Kind::none) return nullptr;
  auto shapes = std::make_unique<Shapes>();
  shapes->kind = kind;
  if (++open_counted == 1) {  // the outermost counted operation: the one counted
    for (const auto& v : fn.inputs()) {
      shapes->inputs.push_back(sizes_of(v));
      shapes->grads.push_back(with_backward && v.isTensor() && v.toTensor().defined() &&
                              v.toTensor().requires_grad());
    }
  }
  return shapes;
}

void leave(const at::RecordFunction& fn, at::ObserverContext* context) {
  auto* shapes = static_cast<Shapes*>(context);
  if (!shapes) return;
  if (--open_counted == 0) {
    if (int64_t* t = total.load()) {
      const int64_t forward = flops_of(*shapes, fn);
      *t += forward + forward / 2 * backward_halves(*shapes);
    }
  }
}

}  // namespace

int64_t count_flops(const std::function<void()>& fn) {
  int64_t counted = 0;
  int64_t* none = nullptr;
  if (!total.compare_exchange_strong(none, &counted)) {
    throw std::logic_error("count_flops: one count at a time");
  }
  // A callback of this thread only, with the operations' arguments and results; no profiler
  // (whose CUDA tracing, once started, stays attached to the process).
  const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&enter, &leave)
                                                     .needsInputs(true)
                                                     .needsOutputs(true)
                                                     .scopes({at::RecordScope::FUNCTION}));
  open_counted = 0;
  try {
    fn();
  } catch (...) {
    at::removeCallback(handle);
    total = nullptr;
    throw;
  }
  at::removeCallback(handle);
  total = nullptr;
  return counted;
}

int64_t count_train_flops(const std::function<void()>& fn) {
  torch::AutoGradMode grad(true);
  with_backward = true;
  try {
    const int64_t counted = count_flops(fn);
    with_backward = false;
    return counted;
  } catch (...) {
    with_backward = false;
    throw;
  }
}

namespace {

void sync(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : 0);
}

}  // namespace

double matmul_peak_tflops(torch::Device device, c10::ScalarType dtype) {
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  // Values from no random generator: a training run measures this without changing its draws.
  const auto a = torch::linspace(-1.0, 1.0, n * n, torch::TensorOptions().device(device))
                     .view({n, n})
                     .to(dtype);      // [n, n]
  const auto b = a.t().contiguous();  // [n, n]
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 7; ++i) {
    sync(device);
    const auto start = std::chrono::steady_clock::now();
    const auto c = torch::mm(a, b);  // [n, n]
    sync(device);
    if (i >= 2)
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best /
         1e12;
}

}  // namespace trainer::engine
