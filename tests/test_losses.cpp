// Losses against hand-computed values.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include <iostream>

#include "engine/measure/memory.h"
#include "losses/loss.h"

namespace trainer::losses {
namespace {

int64_t engine_free_peak(const std::function<void()>& fn) {
  return engine::measure_cpu_peak(fn);
}

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

// Targets of kIgnoreIndex (tokens that do not train) are left out, as LibTorch's ignore_index
// leaves them: the mean over the others, and zero gradients for their rows; on both paths (ATen's
// below 8192 classes, the memory-lean one from there), with and without label smoothing. With no
// target left, the loss is 0 and so is every gradient.
TEST(Losses, CrossEntropyLeavesOutIgnoredTargets) {
  torch::manual_seed(2);
  for (const int64_t k : {int64_t{7}, int64_t{8192}}) {
    for (double smoothing : {0.0, 0.1}) {
      SCOPED_TRACE(testing::Message() << "classes " << k << " smoothing " << smoothing);
      config::TrainConfig cfg;
      cfg.label_smoothing = smoothing;
      auto loss = loss_registry().get("cross_entropy")(cfg);
      const auto base = torch::randn({2, 5, k}, torch::kDouble) * 3;
      auto targets = torch::randint(k, {2, 5});
      targets.index_put_({0, torch::indexing::Slice(1, 4)}, kIgnoreIndex);
      targets.index_put_({1, 4}, kIgnoreIndex);
      auto ours_in = base.clone().requires_grad_(true);
      auto ref_in = base.clone().requires_grad_(true);
      auto ours = loss(ours_in * 1.0, targets);
      auto ref = torch::nn::functional::cross_entropy(
          ref_in.reshape({-1, k}), targets.flatten(),
          torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(smoothing));
      EXPECT_NEAR(ours.item<double>(), ref.item<double>(), 1e-10);
      ours.backward();
      ref.backward();
      EXPECT_LE((ours_in.grad() - ref_in.grad()).abs().max().item<double>(), 1e-12);
      EXPECT_EQ(ours_in.grad()[0][2].abs().max().item<double>(), 0.0);
      auto none_in = base.clone().requires_grad_(true);
      auto none = loss(none_in * 1.0, torch::full({2, 5}, kIgnoreIndex));
      none.backward();
      EXPECT_EQ(none.item<double>(), 0.0);
      EXPECT_EQ(none_in.grad().abs().max().item<double>(), 0.0);
    }
  }
}

// The memory-lean cross-entropy (the one language models take, and every model on a GPU) against
// ATen's log_softmax + nll_loss: the loss (relative) and its gradient (8 rows: entries up to 1/8)
// within 1e-6 in float32, 1e-12 in float64; and the memory a forward and backward takes beyond
// the logits: the gradient is written over them, where ATen keeps the log-probabilities and makes
// two gradients.
TEST(Losses, LeanCrossEntropyEqualsATensAndHoldsLess) {
  torch::manual_seed(1);
  config::TrainConfig cfg;
  auto loss = loss_registry().get("cross_entropy")(cfg);
  int64_t n = 8, k = 16384;
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    const double tol = dtype == torch::kFloat ? 1e-6 : 1e-12;
    const auto base = (torch::randn({n, k}, dtype) * 4).requires_grad_(true);
    auto targets = torch::randint(k, {n});
    targets[0] = torch::argmax(base[0]);  // a confident row: its target's gradient near 0
    // The model's output: a tensor the loss may overwrite.
    auto logits = base * 1.0;
    auto ours = loss(logits, targets);
    ours.backward();
    const auto ours_grad = base.grad().clone();
    base.mutable_grad().reset();
    auto ref = torch::nn::functional::cross_entropy(base * 1.0, targets);
    ref.backward();
    const auto ref_grad = base.grad();
    EXPECT_LE(std::abs(ours.item<double>() - ref.item<double>()), tol * ref.item<double>());
    EXPECT_LE((ours_grad - ref_grad).abs().max().item<double>(), tol);
  }
  n = 128;
  const auto logits_bytes = static_cast<int64_t>(n * k * sizeof(float));
  auto peak = [&](bool lean) {
    const auto base = (torch::randn({n, k}) * 4).requires_grad_(true);
    const auto targets = torch::randint(k, {n});
    auto logits = base * 1.0;  // allocated before the measurement
    return engine_free_peak([&] {
      auto l = lean ? loss(logits, targets) : torch::nn::functional::cross_entropy(logits, targets);
      l.backward();
    });
  };
  const int64_t lean = peak(true), aten = peak(false);
  // base.grad is allocated in both: one [N, K] tensor.
  EXPECT_LE(lean, logits_bytes + logits_bytes / 8) << "lean " << lean << " ATen " << aten;
  EXPECT_GE(aten, 2 * logits_bytes) << "lean " << lean << " ATen " << aten;
  std::cout << "cross-entropy forward+backward peak beyond the logits, N " << n << " K " << k
            << ": lean " << lean / 1048576.0 << " MiB, ATen " << aten / 1048576.0 << " MiB\n";
}

TEST(Losses, RegistryListsBuiltins) {
  EXPECT_EQ(loss_registry().names(), std::vector<std::string>{"cross_entropy"});
}

}  // namespace
}  // namespace trainer::losses
