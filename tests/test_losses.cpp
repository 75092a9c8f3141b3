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

TEST(Losses, RegistryListsBuiltins) {
  EXPECT_EQ(loss_registry().names(), std::vector<std::string>{"cross_entropy"});
}

}  // namespace
}  // namespace trainer::losses
