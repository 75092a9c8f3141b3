// Counting model FLOPs (engine/measure/flops.h) and the trainer's forward count for `trainer
// bench`.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "config/loader.h"
#include "engine/loop/trainer.h"
#include "engine/measure/flops.h"
#include "engine/setup/components.h"
#include "nn/autocast.h"
#include "temp_dir.h"

namespace trainer::engine {
namespace {

TEST(Flops, LinearCountsTwoPerMultiplyAdd) {
  torch::nn::Linear linear(/*in=*/48, /*out=*/20);
  const auto x = torch::randn({7, 48});  // [B, in]
  EXPECT_EQ(count_flops([&] { linear->forward(x); }), 2 * 7 * 48 * 20);
  const auto seq = torch::randn({3, 5, 48});  // [B, T, in]: folded into one product
  EXPECT_EQ(count_flops([&] { linear->forward(seq); }), 2 * 15 * 48 * 20);
}

TEST(Flops, ConvolutionCountsItsOutputPositions) {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(/*in=*/3, /*out=*/8, /*kernel=*/3).stride(2));
  const auto x = torch::randn({2, 3, 17, 17});  // [B, C, H, W] -> [2, 8, 8, 8]
  EXPECT_EQ(count_flops([&] { conv->forward(x); }), 2 * 2 * 8 * 8 * 8 * 3 * 3 * 3);
}

TEST(Flops, AttentionCountsBothProducts) {
  const auto q = torch::randn({2, 4, 16, 8});  // [B, H, L, E]
  const auto k = torch::randn({2, 4, 16, 8});  // [B, H, S, E]
  const auto v = torch::randn({2, 4, 16, 8});  // [B, H, S, E]
  const int64_t flops =
      count_flops([&] { at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true); });
  EXPECT_EQ(flops, 4 * 2 * 4 * 16 * 16 * 8);
}

TEST(Flops, AutocastCountsEachProductOnce) {
  torch::nn::Linear linear(32, 16);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 4, 3));
  const auto x = torch::randn({4, 32});
  const auto img = torch::randn({1, 3, 9, 9});
  auto work = [&] {
    linear->forward(x);
    conv->forward(img);
  };
  const int64_t plain = count_flops(work);
  const int64_t autocast = count_flops([&] {
    nn::AutocastGuard guard(torch::kCPU, torch::kBFloat16, /*enabled=*/true);
    work();
  });
  EXPECT_EQ(plain, 2 * 4 * 32 * 16 + 2 * 4 * 7 * 7 * 3 * 3 * 3);
  EXPECT_EQ(autocast, plain);
}

TEST(Flops, ElementwiseWorkIsNotCounted) {
  const auto x = torch::randn({64, 64});
  EXPECT_EQ(count_flops([&] { torch::relu(x * 2 + 1).softmax(/*dim=*/1); }), 0);
}

// The products a real backward runs (on the CPU, autograd runs it on this thread), counted.
int64_t backward_flops(const torch::Tensor& y) {
  return count_flops([&] { y.sum().backward(); });
}

// LoRA's layer: a frozen base weight and a trained low-rank update, after a trained layer. The
// base costs its forward and its input's gradient, no weight gradient: 2 x all parameters x
// tokens forward, as much for the input gradients, 2 x the trained parameters for the weights'.
TEST(Flops, AFrozenWeightCostsNoWeightGradient) {
  const int64_t B = 6, in = 20, h = 24, o = 16, r = 4;
  torch::nn::Linear first(torch::nn::LinearOptions(in, h).bias(false));
  torch::nn::Linear base(torch::nn::LinearOptions(h, o).bias(false));
  torch::nn::Linear a(torch::nn::LinearOptions(h, r).bias(false));
  torch::nn::Linear b(torch::nn::LinearOptions(r, o).bias(false));
  base->weight.set_requires_grad(false);
  const auto x = torch::randn({B, in});  // [B, in]: data, no gradient
  const auto forward = [&] {
    const auto z = first->forward(x);  // [B, h]
    return base->forward(z) + b->forward(a->forward(z));
  };
  const int64_t counted = count_train_flops([&] { forward(); });
  // The brief's rule, but the first layer's input is data: no gradient for it.
  const int64_t all = in * h + h * o + h * r + r * o, trained = in * h + h * r + r * o;
  EXPECT_EQ(counted, 2 * B * all + 2 * B * (all - in * h) + 2 * B * trained);
  // The products the backward runs.
  int64_t fwd = count_flops([&] { forward(); });
  const auto y = forward();
  EXPECT_EQ(counted, fwd + backward_flops(y));
  EXPECT_LT(counted, 3 * fwd);
}

// Everything trained: 3 x the forward (the rule of the other models), attention's too.
TEST(Flops, AFullyTrainedStepIsThreeForwards) {
  torch::nn::Linear l1(12, 10), l2(10, 6);
  const auto x = torch::randn({5, 12}).requires_grad_(true);  // [B, in]
  const auto forward = [&] { return l2->forward(torch::relu(l1->forward(x))); };
  const int64_t fwd = count_flops([&] { forward(); });
  EXPECT_EQ(count_train_flops([&] { forward(); }), 3 * fwd);
  EXPECT_EQ(3 * fwd, fwd + backward_flops(forward()));
  const auto q = torch::randn({2, 4, 16, 8}).requires_grad_(true);  // [B, H, L, E]
  const auto kv = torch::randn({2, 4, 16, 8});                      // [B, H, S, E], data
  const auto attend = [&] { at::scaled_dot_product_attention(q, kv, kv, {}, 0.0, true); };
  // dQ and dP (for q) only: half the forward each.
  EXPECT_EQ(count_train_flops(attend), 2 * count_flops(attend));
  EXPECT_EQ(count_flops(attend), 4 * 2 * 4 * 16 * 16 * 8);
}

TEST(Flops, TrainerCountsOneForwardOverOneBatch) {
  test_support::TempDir tmp("flops");
  const auto path = tmp.path() / "mlp.yaml";
  std::ofstream(path) << "device: cpu\nmodel: {name: mlp, hidden: [24, 12]}\n"
                         "data: {name: synthetic, shape: [1, 4, 5], num_classes: 3, "
                         "train_samples: 64, val_samples: 8, batch_size: 16, workers: 0}\n";
  auto loaded = engine::load_config(path.string(), {});
  config::check(loaded, config::Environment{});
  Trainer trainer(loaded);
  EXPECT_EQ(trainer.forward_flops(), 2 * 16 * (20 * 24 + 24 * 12 + 12 * 3));
}

}  // namespace
}  // namespace trainer::engine
