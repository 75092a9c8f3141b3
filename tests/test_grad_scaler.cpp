// The gradient scaler: torch.amp.GradScaler's scale sequence, unscaling and inf detection, state.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "optim/grad_scaler.h"

namespace trainer::optim {
namespace {

GradScalerOptions small_options() {
  GradScalerOptions o;
  o.init_scale = 4.0;
  o.growth_factor = 2.0;
  o.backoff_factor = 0.5;
  o.growth_interval = 3;
  return o;
}

torch::Tensor flag(bool inf) {
  return torch::full({}, inf ? 1.0f : 0.0f);
}

// With the defaults, the scale follows torch.amp.GradScaler()'s: it starts at 2**16, halves on
// a step with inf/NaN gradients, and doubles on the 2000th clean step after it (not before).
TEST(GradScalerTest, DefaultsScaleAsTorchAmps) {
  GradScaler scaler(GradScalerOptions{}, torch::kCPU);
  const auto loss = torch::full({}, 3.0f);
  EXPECT_EQ(scaler.scale(loss).item<float>(), 3.0f * std::pow(2.0f, 16.0f));
  scaler.update(flag(true));
  EXPECT_EQ(scaler.scale_value(), std::pow(2.0, 15.0));
  for (int i = 1; i < 2000; ++i) scaler.update(flag(false));
  EXPECT_EQ(scaler.scale_value(), std::pow(2.0, 15.0));
  scaler.update(flag(false));
  EXPECT_EQ(scaler.scale_value(), std::pow(2.0, 16.0));
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScalerTest, GrowsAfterGrowthIntervalCleanSteps) {
  GradScaler scaler(small_options(), torch::kCPU);
  const double expected[] = {4, 4, 8, 8, 8, 16, 16};  // after each clean update
  const int64_t tracker[] = {1, 2, 0, 1, 2, 0, 1};
  for (int i = 0; i < 7; ++i) {
    scaler.update(flag(false));
    EXPECT_EQ(scaler.scale_value(), expected[i]) << "after clean update " << i + 1;
    EXPECT_EQ(scaler.growth_tracker(), tracker[i]) << "after clean update " << i + 1;
  }
}

TEST(GradScalerTest, BacksOffOnInfAndRestartsTheCount) {
  GradScaler scaler(small_options(), torch::kCPU);
  scaler.update(flag(false));
  scaler.update(flag(false));
  scaler.update(flag(true));  // the third update would have grown the scale
  EXPECT_EQ(scaler.scale_value(), 2.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  scaler.update(flag(true));
  EXPECT_EQ(scaler.scale_value(), 1.0);
  for (int i = 0; i < 3; ++i) scaler.update(flag(false));
  EXPECT_EQ(scaler.scale_value(), 2.0);
}

TEST(GradScalerTest, NeverGrowsToInfinity) {
  GradScalerOptions o = small_options();
  o.init_scale = 3e38;  // float32 max is 3.4e38
  o.growth_interval = 1;
  GradScaler scaler(o, torch::kCPU);
  scaler.update(flag(false));
  EXPECT_FLOAT_EQ(static_cast<float>(scaler.scale_value()), 3e38f);
}

TEST(GradScalerTest, ScalesTheLoss) {
  GradScaler scaler(small_options(), torch::kCPU);
  EXPECT_EQ(scaler.scale(torch::full({}, 1.5f)).item<float>(), 6.0f);
}

TEST(GradScalerTest, UnscalesEveryGradientAndFindsNoInf) {
  GradScaler scaler(small_options(), torch::kCPU);
  auto a = torch::zeros({3}, torch::requires_grad());
  auto b = torch::zeros({2, 2}, torch::requires_grad());
  auto c = torch::zeros({2}, torch::requires_grad());  // no gradient: skipped
  a.mutable_grad() = torch::tensor({4.0f, -8.0f, 2.0f});
  b.mutable_grad() = torch::full({2, 2}, 12.0f);
  const auto found = scaler.unscale({a, b, c});
  EXPECT_EQ(found.item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(a.grad(), torch::tensor({1.0f, -2.0f, 0.5f})));
  EXPECT_TRUE(torch::equal(b.grad(), torch::full({2, 2}, 3.0f)));
  EXPECT_FALSE(c.grad().defined());
}

TEST(GradScalerTest, FindsInfAndNanInAnyGradient) {
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    GradScaler scaler(small_options(), torch::kCPU);
    auto a = torch::zeros({3}, torch::requires_grad());
    auto b = torch::zeros({3}, torch::requires_grad());
    a.mutable_grad() = torch::ones({3});
    b.mutable_grad() = torch::tensor({1.0f, bad, 1.0f});
    EXPECT_EQ(scaler.unscale({a, b}).item<float>(), 1.0f) << bad;
  }
}

TEST(GradScalerTest, StateRoundTrips) {
  GradScaler a(small_options(), torch::kCPU);
  a.update(flag(true));
  a.update(flag(false));
  GradScaler b(small_options(), torch::kCPU);
  std::vector<std::pair<std::string, torch::Tensor>> copy;
  for (const auto& [name, t] : a.state()) copy.emplace_back(name, t.clone());
  b.load_state(copy);
  EXPECT_EQ(b.scale_value(), 2.0);
  EXPECT_EQ(b.growth_tracker(), 1);
  b.update(flag(false));
  b.update(flag(false));
  EXPECT_EQ(b.scale_value(), 4.0);  // the restored count carried on
  EXPECT_THROW(b.load_state({{"scale", torch::zeros({})}}), std::runtime_error);
  EXPECT_THROW(b.load_state({{"scale", torch::zeros({}, torch::kDouble)},
                             {"growth_tracker", torch::zeros({}, torch::kInt)}}),
               std::runtime_error);
}

}  // namespace
}  // namespace trainer::optim
