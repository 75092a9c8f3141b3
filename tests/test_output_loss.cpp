// The output layer and the cross-entropy in one, chunked over rows (losses/output_loss.h), against
// ATen's cross_entropy of ATen's linear: the loss and the gradients of the hidden states and of
// the weight, with ignored targets, label smoothing and chunks of 1, 5 and the default rows; under
// bfloat16 autocast against the unfused loss within bfloat16 rounding; and its memory: no batch
// of logits held.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "engine/measure/memory.h"
#include "losses/loss.h"
#include "losses/output_loss.h"
#include "models/model.h"
#include "nn/aligned_linear.h"
#include "nn/autocast.h"

namespace trainer::losses {
namespace {

namespace F = torch::nn::functional;

struct Grads {
  torch::Tensor loss, hidden, weight;
};

// hidden [N, C] and weight [V, C] leaves; targets [N] with every third one ignored.
struct Problem {
  torch::Tensor hidden, weight, targets;
  Problem(int64_t n, int64_t c, int64_t v, torch::ScalarType type) {
    torch::manual_seed(0);
    hidden = torch::randn({n, c}, torch::dtype(type));
    weight = (0.3 * torch::randn({v, c}, torch::dtype(type)));
    targets = torch::randint(v, {n}, torch::kLong);
    targets.index_put_({torch::arange(0, n, 3)}, kIgnoreIndex);
  }

  template <class Fn>
  Grads run(Fn loss_of) const {
    auto h = hidden.clone().requires_grad_(true), w = weight.clone().requires_grad_(true);
    auto loss = loss_of(h, w);
    loss.backward();
    return {loss.detach(), h.grad(), w.grad()};
  }
};

Grads reference(const Problem& p, double smoothing) {
  return p.run([&](const torch::Tensor& h, const torch::Tensor& w) {
    return F::cross_entropy(
        F::linear(h, w), p.targets,
        F::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).label_smoothing(smoothing));
  });
}

void expect_close(const std::string& what, const torch::Tensor& got, const torch::Tensor& want,
                  double tol) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  const double err = (got.to(torch::kDouble) - want.to(torch::kDouble)).abs().max().item<double>();
  const double scale = want.to(torch::kDouble).abs().max().item<double>();
  EXPECT_LE(err, tol * scale) << what << ": max |difference| " << err << ", largest " << scale;
}

TEST(OutputLoss, ChunkedEqualsCrossEntropyOfTheProduct) {
  for (const auto type : {torch::kDouble, torch::kFloat}) {
    // float64: the same arithmetic in another order; float32: within its rounding over sums of
    // a few hundred terms.
    const double tol = type == torch::kDouble ? 1e-12 : 2e-6;
    const Problem p(/*n=*/37, /*c=*/24, /*v=*/301, type);
    for (const double smoothing : {0.0, 0.1}) {
      const auto want = reference(p, smoothing);
      for (const int64_t rows : {int64_t{1}, int64_t{5}, int64_t{0}}) {
        SCOPED_TRACE(std::string(c10::toString(type)) + ", smoothing " + std::to_string(smoothing) +
                     ", chunk rows " + std::to_string(rows));
        const auto got = p.run([&](const torch::Tensor& h, const torch::Tensor& w) {
          return chunked_linear_cross_entropy(h, w, p.targets, smoothing, rows);
        });
        expect_close("loss", got.loss, want.loss, tol);
        expect_close("grad of hidden", got.hidden, want.hidden, tol);
        expect_close("grad of weight", got.weight, want.weight, tol);
      }
    }
  }
}

TEST(OutputLoss, ScalesItsGradientsByTheIncomingOne) {
  const Problem p(9, 8, 70, torch::kDouble);
  const auto want = reference(p, 0.0);
  const auto got = p.run([&](const torch::Tensor& h, const torch::Tensor& w) {
    return 3.0 * chunked_linear_cross_entropy(h, w, p.targets, 0.0, 4);
  });
  expect_close("grad of hidden", got.hidden, 3.0 * want.hidden, 1e-12);
  expect_close("grad of weight", got.weight, 3.0 * want.weight, 1e-12);
}

TEST(OutputLoss, EveryTargetIgnoredIsZeroWithZeroGradients) {
  Problem p(6, 8, 40, torch::kFloat);
  p.targets.fill_(kIgnoreIndex);
  const auto got = p.run([&](const torch::Tensor& h, const torch::Tensor& w) {
    return chunked_linear_cross_entropy(h, w, p.targets, 0.0, 4);
  });
  EXPECT_EQ(got.loss.item<float>(), 0.0f);
  EXPECT_EQ(got.hidden.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(got.weight.abs().max().item<float>(), 0.0f);
}

// Under bfloat16 autocast the product runs in bfloat16 as linear's does, the loss in float32;
// the gradients come back in the inputs' dtype (float32). Against the unfused loss under the same
// autocast: the logits of both are the same bfloat16 products, so the losses agree within float32
// sums; the gradients within bfloat16 rounding (the unfused weight gradient is one bfloat16
// product over all rows, the chunked one a float32 sum of per-chunk bfloat16 products).
TEST(OutputLoss, Bfloat16AutocastWithinRounding) {
  const Problem p(64, 32, 515, torch::kFloat);
  const auto unfused = loss_registry().get("cross_entropy")(config::TrainConfig{});
  const auto under_autocast = [&](auto fn) {
    return p.run([&](const torch::Tensor& h, const torch::Tensor& w) {
      nn::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
      return fn(h, w);
    });
  };
  const auto want = under_autocast([&](const torch::Tensor& h, const torch::Tensor& w) {
    return unfused(nn::aligned_linear(h, w), p.targets);
  });
  const auto output = output_loss(config::TrainConfig{});
  ASSERT_TRUE(output);
  const auto got = under_autocast(
      [&](const torch::Tensor& h, const torch::Tensor& w) { return output(h, w, p.targets); });
  EXPECT_EQ(got.loss.scalar_type(), torch::kFloat);
  expect_close("loss", got.loss, want.loss, 1e-6);
  expect_close("grad of hidden", got.hidden, want.hidden, std::ldexp(1.0, -7));
  expect_close("grad of weight", got.weight, want.weight, std::ldexp(1.0, -7));
  // And the bfloat16 rounding is there: float32 products give another loss.
  const auto fp32 = reference(p, 0.0);
  EXPECT_GT((got.loss - fp32.loss).abs().item<double>(), 1e-6);
}

// 2,048 rows over a vocabulary of 8,192: the unfused loss holds the [N, V] logits (64 MiB in
// float32) through backward; the chunked one a chunk of them (an eighth here) and the two
// gradients: under a quarter of the unfused peak.
TEST(OutputLoss, HoldsNoBatchOfLogits) {
  const Problem p(2048, 64, 8192, torch::kFloat);
  const auto unfused = loss_registry().get("cross_entropy")(config::TrainConfig{});
  const auto output = output_loss(config::TrainConfig{});
  auto h = p.hidden.clone().requires_grad_(true), w = p.weight.clone().requires_grad_(true);
  const int64_t logits_bytes = 2048 * 8192 * 4;
  const int64_t before =
      engine::measure_cpu_peak([&] { unfused(nn::aligned_linear(h, w), p.targets).backward(); });
  const int64_t after = engine::measure_cpu_peak([&] { output(h, w, p.targets).backward(); });
  EXPECT_GE(before, logits_bytes);
  EXPECT_LT(after, before / 4) << "unfused " << before << " bytes";
}

// model.fused_kernels: `on` gives gpt (tied) and llama (untied) an output weight on the CPU, whose
// product with forward_hidden is forward's logits; `auto` and `off` none on the CPU.
TEST(OutputLoss, ModelsGiveTheirOutputWeightWhenFused) {
  for (const std::string name : {"gpt", "llama"}) {
    for (const std::string setting : {"on", "auto", "off"}) {
      SCOPED_TRACE(name + ", fused_kernels " + setting);
      config::ModelConfig cfg = models::default_model_config(name);
      cfg.options.set("n_layer", int64_t{2});
      cfg.options.set("n_head", int64_t{2});
      cfg.options.set("n_embd", int64_t{32});
      cfg.options.set("block_size", int64_t{16});
      cfg.options.set("vocab_size", int64_t{70});
      cfg.options.set("fused_kernels", setting);
      torch::manual_seed(0);
      auto net = models::build_model(cfg, models::InputSpec{{16}, 70});
      net->eval();
      const auto x = torch::randint(70, {2, 16}, torch::kLong);
      const auto weight = net->output_weight();
      ASSERT_EQ(weight.defined(), setting == "on");
      if (!weight.defined()) continue;
      const auto logits = net->forward(x);  // [2, 16, 70]
      const auto product = torch::matmul(net->forward_hidden(x, {}), weight.t());
      EXPECT_TRUE(torch::allclose(product, logits, 1e-5, 1e-6));
    }
  }
}

TEST(OutputLoss, OnlyCrossEntropyHasOne) {
  config::TrainConfig cfg;
  EXPECT_TRUE(output_loss(cfg));
  cfg.loss = "something_else";
  EXPECT_FALSE(output_loss(cfg));
}

}  // namespace
}  // namespace trainer::losses
