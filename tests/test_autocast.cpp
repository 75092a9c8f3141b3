// The autocast guard: torch.autocast's casts on the CPU, nesting, and the state it leaves behind.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "nn/autocast.h"

namespace trainer::nn {
namespace {

TEST(AutocastTest, CpuBf16CastsLinearAndConvButNotTheLoss) {
  torch::manual_seed(0);
  torch::nn::Linear linear(8, 4);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 2, 3));
  const auto x = torch::randn({5, 8});
  const auto img = torch::randn({1, 3, 6, 6});
  const auto targets = torch::randint(/*high=*/4, {5});
  torch::Tensor logits, features, loss;
  {
    AutocastGuard guard(torch::kCPU, torch::kBFloat16);
    logits = linear->forward(x);
    features = conv->forward(img);
    loss = torch::nn::functional::cross_entropy(logits, targets);
  }
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(features.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  EXPECT_EQ(linear->weight.scalar_type(), torch::kFloat);  // parameters stay float32
  // After the guard: float32 again, and autocast is off.
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  EXPECT_EQ(linear->forward(x).scalar_type(), torch::kFloat);
}

TEST(AutocastTest, DisabledGuardChangesNothing) {
  torch::nn::Linear linear(8, 4);
  {
    AutocastGuard guard(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
    EXPECT_EQ(linear->forward(torch::randn({2, 8})).scalar_type(), torch::kFloat);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
}

TEST(AutocastTest, NestedRegionsRestoreTheOuterSettings) {
  torch::nn::Linear linear(8, 4);
  const auto x = torch::randn({2, 8});
  AutocastGuard outer(torch::kCPU, torch::kBFloat16);
  {
    AutocastGuard inner(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
    EXPECT_EQ(linear->forward(x).scalar_type(), torch::kFloat);
  }
  EXPECT_TRUE(at::autocast::is_autocast_enabled(torch::kCPU));
  EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCPU), torch::kBFloat16);
  EXPECT_EQ(linear->forward(x).scalar_type(), torch::kBFloat16);
}

TEST(AutocastTest, StateCapturesAndReinstatesBothDevices) {
  AutocastState before = AutocastState::current();
  AutocastState recorded;
  {
    AutocastGuard guard(torch::kCPU, torch::kBFloat16);
    recorded = AutocastState::current();
  }
  EXPECT_TRUE(recorded.cpu_enabled);
  EXPECT_FALSE(recorded.cuda_enabled);
  {
    AutocastGuard replay(recorded);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCPU), torch::kBFloat16);
  }
  const auto after = AutocastState::current();
  EXPECT_EQ(after.cpu_enabled, before.cpu_enabled);
  EXPECT_EQ(after.cuda_enabled, before.cuda_enabled);
}

TEST(AutocastTest, RejectsDevicesWithoutAutocast) {
  EXPECT_THROW(AutocastGuard(torch::kMeta, torch::kBFloat16), std::invalid_argument);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
}

}  // namespace
}  // namespace trainer::nn
