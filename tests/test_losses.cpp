// Losses against hand-computed values.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "losses/loss.h"

namespace trainer::losses {
namespace {

// Logits (ln 3, 0): softmax (0.75, 0.25); target 0.
const auto kLogits = [] { return torch::tensor({{std::log(3.0), 0.0}}, torch::kDouble); };
const auto kTarget = [] { return torch::tensor({int64_t{0}}); };

TEST(Losses, CrossEntropy) {
  config::TrainConfig cfg;
  auto loss = loss_registry().get("cross_entropy")(cfg);
  EXPECT_NEAR(loss(kLogits(), kTarget()).item<double>(), -std::log(0.75), 1e-12);
}

TEST(Losses, CrossEntropyWithLabelSmoothing) {
  config::TrainConfig cfg;
  cfg.label_smoothing = 0.2;
  auto loss = loss_registry().get("cross_entropy")(cfg);
  // Target distribution (1 - 0.2 + 0.1, 0.1) = (0.9, 0.1).
  const double want = -(0.9 * std::log(0.75) + 0.1 * std::log(0.25));
  EXPECT_NEAR(loss(kLogits(), kTarget()).item<double>(), want, 1e-12);
}

// Loss and gradient against LibTorch's cross_entropy, for classes and sequences, with and without
// label smoothing, in float32 and from bfloat16 logits.
TEST(Losses, CrossEntropyMatchesLibTorch) {
  torch::manual_seed(0);
  for (double smoothing : {0.0, 0.1}) {
    // The last shape has as many classes as the loss's memory-lean path starts at.
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{6, 5}, std::vector<int64_t>{2, 3, 7},
          std::vector<int64_t>{2, 8192}}) {
      for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
        SCOPED_TRACE(testing::Message() << "smoothing " << smoothing << " dims " << shape.size()
                                        << " dtype " << dtype);
        config::TrainConfig cfg;
        cfg.label_smoothing = smoothing;
        auto loss = loss_registry().get("cross_entropy")(cfg);
        const auto base = torch::randn(shape) * 3;
        std::vector<int64_t> target_shape(shape.begin(), shape.end() - 1);
        const auto targets = torch::randint(shape.back(), target_shape);
        auto ours_in = base.to(dtype).requires_grad_(true);
        auto ref_in = base.to(dtype).requires_grad_(true);
        auto ours = loss(ours_in, targets);
        auto ref = torch::nn::functional::cross_entropy(
            ref_in.to(torch::kFloat).reshape({-1, shape.back()}), targets.flatten(),
            torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(smoothing));
        EXPECT_EQ(ours.scalar_type(), torch::kFloat);
        EXPECT_NEAR(ours.item<double>(), ref.item<double>(), 1e-5);
        (ours * 3).backward();
        (ref * 3).backward();
        EXPECT_EQ(ours_in.grad().scalar_type(), dtype);
        EXPECT_TRUE(torch::allclose(ours_in.grad().to(torch::kFloat),
                                    ref_in.grad().to(torch::kFloat), /*rtol=*/1e-2,
                                    /*atol=*/dtype == torch::kFloat ? 1e-6 : 1e-3));
      }
    }
  }
}

TEST(Losses, RegistryListsBuiltins) {
  EXPECT_EQ(loss_registry().names(), std::vector<std::string>{"cross_entropy"});
}

}  // namespace
}  // namespace trainer::losses
