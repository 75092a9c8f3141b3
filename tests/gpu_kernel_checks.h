// What the fused kernels' GPU tests share: the skip without a GPU, the tolerances (explained at
// the top of tests/test_gpu_kernels.cpp) and the two comparisons.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible"

namespace trainer::test_support {

// float32 elementwise within 1e-5; bfloat16 / float16 within 2^-7 (two bfloat16 units in the
// last place).
inline double tolerance(torch::ScalarType t) {
  return t == torch::kFloat ? 1e-5 : std::ldexp(1.0, -7);
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

}  // namespace trainer::test_support
