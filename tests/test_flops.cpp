// Counting model FLOPs (engine/flops.h) and the trainer's forward count for `trainer bench`.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "config/loader.h"
#include "engine/loop/components.h"
#include "engine/measure/flops.h"
#include "engine/loop/trainer.h"
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
