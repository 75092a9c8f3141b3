// What the fused kernels' GPU tests share: the skip without a GPU, the tolerances (explained at
// the top of tests/test_gpu_kernels.cpp) and the two comparisons.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible"

namespace trainer::test_support {

// float32 elementwise within 1e-5; bfloat16 / float16 within 2^-7 (two bfloat16 units in the
// last place).
inline double tolerance(torch::ScalarType t) {
  return t == torch::kFloat ? 1e-5 : std::ldexp(1.0, -7);
}

// The (input, weight) dtypes the norm kernels take: equal, or a float32 weight (autocast's).
inline std::vector<std::pair<torch::ScalarType, torch::ScalarType>> norm_dtypes() {
  return {{torch::kFloat, torch::kFloat},
          {torch::kBFloat16, torch::kBFloat16},
          {torch::kBFloat16, torch::kFloat},
          {torch::kHalf, torch::kHalf}};
}

// Elementwise: |got - want| <= tol * (|want| + max|want|), of one dtype and shape.
inline void expect_close(const std::string& what, const torch::Tensor& got,
                         const torch::Tensor& want, double tol) {
  ASSERT_TRUE(got.defined() && want.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  const double scale = w.abs().max().item<double>();
  const auto excess = (g - w).abs() - tol * (w.abs() + scale);
  EXPECT_LE(excess.max().item<double>(), 0.0)
      << what << ": max |difference| " << (g - w).abs().max().item<double>() << " (largest value "
      << scale << ", tolerance " << tol << ")";
}

// In norm: ||got - want|| <= tol * ||want||.
inline void expect_close_norm(const std::string& what, const torch::Tensor& got,
                              const torch::Tensor& want, double tol) {
  ASSERT_TRUE(got.defined() && want.defined()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  EXPECT_LE((g - w).norm().item<double>(), tol * w.norm().item<double>() + 1e-12) << what;
}

// Whether the autograd graph behind y holds a node whose name contains `name` (a fused function's
// node: the fused path was taken).
inline bool graph_has(const torch::Tensor& y, const std::string& name) {
  std::vector<torch::autograd::Node*> todo{y.grad_fn().get()};
  std::unordered_set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (node->name().find(name) != std::string::npos) return true;
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  return false;
}

}  // namespace trainer::test_support
