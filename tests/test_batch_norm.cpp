// The models' batch norm: LibTorch's BatchNorm2d, and its global-batch form (dist.sync_bn).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "models/model.h"
#include "nn/batch_norm.h"

namespace {

using trainer::nn::BatchNorm2d;

// With one process the global batch is the local one: the synchronised form must give what
// LibTorch's batch norm gives, forward, backward and running statistics.
TEST(BatchNorm, GlobalBatchOfOneProcessEqualsLibTorch) {
  torch::manual_seed(0);
  const auto options = torch::nn::BatchNorm2dOptions(3).momentum(0.1);
  BatchNorm2d sync(options), plain(options);
  int sums = 0;
  ASSERT_EQ(trainer::nn::sync_batch_norm(
                *sync, {/*rank=*/0, /*world_size=*/1, [&](torch::Tensor&) { ++sums; }}),
            1);
  torch::nn::BatchNorm2d reference(options);
  sync->weight.data().uniform_(0.5, 1.5);
  reference->weight.data().copy_(sync->weight.data());
  plain->weight.data().copy_(sync->weight.data());

  for (int step = 0; step < 3; ++step) {
    auto x = (torch::randn({4, 3, 5, 5}) * 3 + 1).requires_grad_();  // [N, C, H, W]
    auto x_ref = x.detach().clone().requires_grad_();
    auto g = torch::randn({4, 3, 5, 5});
    auto y = sync(x);
    auto y_ref = reference(x_ref);
    EXPECT_TRUE(torch::allclose(y, y_ref, /*rtol=*/1e-5, /*atol=*/1e-5));
    (y * g).sum().backward();
    (y_ref * g).sum().backward();
    EXPECT_TRUE(torch::allclose(x.grad(), x_ref.grad(), 1e-4, 1e-5));
    EXPECT_TRUE(torch::allclose(sync->weight.grad(), reference->weight.grad(), 1e-4, 1e-5));
    EXPECT_TRUE(torch::allclose(sync->bias.grad(), reference->bias.grad(), 1e-4, 1e-5));
    EXPECT_TRUE(torch::allclose(sync->running_mean, reference->running_mean, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(sync->running_var, reference->running_var, 1e-5, 1e-6));
    EXPECT_EQ(sync->num_batches_tracked.item<int64_t>(), step + 1);
  }
  // One sum in forward and one in backward per step.
  EXPECT_EQ(sums, 6);
  // Evaluation uses the running statistics, without sums.
  sync->eval();
  reference->eval();
  auto x = torch::randn({2, 3, 4, 4});
  EXPECT_TRUE(torch::allclose(sync(x), reference(x), 1e-5, 1e-6));
  EXPECT_EQ(sums, 6);
  // Without a sum it is LibTorch's batch norm itself.
  plain->train();
  EXPECT_EQ(trainer::nn::sync_batch_norm(*plain, {}), 1);
  EXPECT_TRUE(torch::allclose(
      plain(x),
      torch::nn::functional::batch_norm(x, torch::Tensor(), torch::Tensor(),
                                        torch::nn::functional::BatchNormFuncOptions()
                                            .weight(plain->weight)
                                            .bias(plain->bias)
                                            .training(true)),
      1e-5, 1e-6));
}

// Activations far from zero with a small spread: the statistics must not lose the variance to
// cancellation (E[x^2] - E[x]^2 in float32 would).
TEST(BatchNorm, GlobalStatisticsKeepTheirPrecisionFarFromZero) {
  torch::manual_seed(1);
  const auto options = torch::nn::BatchNorm2dOptions(4);
  BatchNorm2d sync(options);
  trainer::nn::sync_batch_norm(*sync, {/*rank=*/0, /*world_size=*/1, [](torch::Tensor&) {}});
  torch::nn::BatchNorm2d reference(options);
  auto x = torch::randn({16, 4, 1, 1}) * 0.05 + 300;  // [N, C, 1, 1]
  const auto y = sync(x), y_ref = reference(x);
  EXPECT_LT((y - y_ref).abs().max().item<float>(), 1e-2);
  EXPECT_TRUE(torch::allclose(sync->running_var, reference->running_var, 1e-3, 1e-6));
}

// Two processes simulated by two threads whose sum meets in the middle: each normalises its half
// of a batch with the statistics of the whole, and gradients flow across, so the pair matches one
// process holding the whole batch (the loss of each half is a mean, averaged over the two as DDP
// averages gradients).
class TwoRanks {
 public:
  // Sums `t` with the other thread's tensor of the same call.
  void sum(int rank, torch::Tensor& t) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t round = round_;
    slot_[rank] = t.clone();
    if (++arrived_ == 2) {
      total_ = slot_[0] + slot_[1];
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
    t.copy_(total_);
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t round_ = 0;
  torch::Tensor slot_[2], total_;
};

TEST(BatchNorm, TwoRanksTrainAsOneWithTheWholeBatch) {
  torch::manual_seed(2);
  const auto options = torch::nn::BatchNorm2dOptions(6);
  auto x = torch::randn({16, 6, 2, 2}) * 0.5 + 3;  // [N, C, H, W]
  x.select(1, 0).fill_(0.0);                       // a dead channel
  x.select(1, 1).mul_(1e-4);                       // a nearly constant one
  x.select(1, 2).clamp_min_(3.0);                  // half its values equal
  auto g = torch::randn({16, 6, 2, 2});
  BatchNorm2d whole(options);
  whole->weight.data().uniform_(0.5, 1.5);
  auto xw = x.clone().requires_grad_();
  (whole(xw) * g).mean().backward();

  TwoRanks link;
  BatchNorm2d half[2] = {BatchNorm2d(options), BatchNorm2d(options)};
  torch::Tensor xs[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    half[r]->weight.data().copy_(whole->weight.data());
    trainer::nn::sync_batch_norm(
        *half[r], {r, /*world_size=*/2, [&link, r](torch::Tensor& t) { link.sum(r, t); }});
    xs[r] = x.slice(0, 8 * r, 8 * r + 8).clone().requires_grad_();
    threads.emplace_back(
        [&, r] { (half[r](xs[r]) * g.slice(0, 8 * r, 8 * r + 8)).mean().backward(); });
  }
  for (auto& t : threads) t.join();
  // d(mean of a half)/dx is twice d(mean of the whole)/dx; DDP's average halves it again.
  const auto dx = torch::cat({xs[0].grad(), xs[1].grad()}) / 2;
  EXPECT_TRUE(torch::allclose(dx, xw.grad(), 1e-4, 1e-6)) << (dx - xw.grad()).abs().max();
  const auto dw = (half[0]->weight.grad() + half[1]->weight.grad()) / 2;
  EXPECT_TRUE(torch::allclose(dw, whole->weight.grad(), 1e-4, 1e-6));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::allclose(half[r]->running_mean, whole->running_mean, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(half[r]->running_var, whole->running_var, 1e-5, 1e-6));
  }
}

// A ResNet over three SGD steps: two simulated ranks with synchronised batch norm (gradients
// averaged as DDP does) take the steps one process takes with the whole batch. In float64: in
// float32 the network's batch norms amplify rounding differences to ~1% by the third step.
TEST(BatchNorm, TwoRanksOfAResNetStepAsOne) {
  trainer::config::ModelConfig cfg = trainer::models::default_model_config();
  cfg.name = "resnet18";
  cfg.options.set("stem", "cifar");
  const trainer::models::InputSpec input{{3, 8, 8}, 4};
  auto build = [&] {
    torch::manual_seed(3);
    auto net = trainer::models::build_model(cfg, input);
    net->to(torch::kDouble);
    return net;
  };
  auto whole = build();
  trainer::models::Net half[2] = {build(), build()};
  TwoRanks link;
  for (int r = 0; r < 2; ++r) {
    trainer::nn::sync_batch_norm(
        *half[r], {r, /*world_size=*/2, [&link, r](torch::Tensor& t) { link.sum(r, t); }});
  }
  torch::manual_seed(4);
  const double lr = 0.05;
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({16, 3, 8, 8}, torch::kDouble) * 2;  // [N, C, H, W]
    auto y = torch::randint(0, 4, {16});                       // [N]
    whole->zero_grad();
    torch::nn::functional::cross_entropy(whole->forward(x), y).backward();
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        half[r]->zero_grad();
        torch::nn::functional::cross_entropy(half[r]->forward(x.slice(0, 8 * r, 8 * r + 8)),
                                             y.slice(0, 8 * r, 8 * r + 8))
            .backward();
      });
    }
    for (auto& t : threads) t.join();
    torch::NoGradGuard no_grad;
    const auto pw = whole->named_parameters();
    const auto p0 = half[0]->named_parameters(), p1 = half[1]->named_parameters();
    for (size_t i = 0; i < pw.size(); ++i) {
      const auto g = (p0[i].value().grad() + p1[i].value().grad()) / 2;  // DDP's average
      const auto& gw = pw[i].value().grad();
      EXPECT_LT(((g - gw).norm() / gw.norm().clamp_min(1e-12)).item<double>(), 1e-4)
          << "step " << step << " " << pw[i].key() << " "
          << ((g - gw).norm() / gw.norm().clamp_min(1e-12)).item<double>();
      pw[i].value().sub_(gw, lr);
      p0[i].value().sub_(g, lr);
      p1[i].value().sub_(g, lr);
    }
  }
}

}  // namespace
