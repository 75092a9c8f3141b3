// One or two steps of each optimizer against hand-computed updates.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "optim/optimizer.h"

namespace trainer::optim {
namespace {

// A weight [1, 2] = {1, -2} (decayed) and a bias [1] = {1} (not decayed by default).
struct TinyImpl : torch::nn::Module {
  TinyImpl() {
    weight = register_parameter("weight", torch::tensor({{1.0, -2.0}}, torch::kDouble));
    bias = register_parameter("bias", torch::tensor({1.0}, torch::kDouble));
  }
  torch::Tensor weight, bias;
};

// Runs optimizer steps at learning rate `lr` with the given gradient (the same for every element)
// at each step.
void run_steps(TinyImpl& m, Optimizer& opt, double lr, const std::vector<double>& grads) {
  for (double g : grads) {
    m.weight.mutable_grad() = torch::full_like(m.weight, g);
    m.bias.mutable_grad() = torch::full_like(m.bias, g);
    opt.step(lr);
  }
}

void expect_values(const torch::Tensor& t, const std::vector<double>& want) {
  auto flat = t.detach().flatten();
  ASSERT_EQ(flat.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(flat[i].item<double>(), want[i], 1e-12) << "element " << i;
  }
}

config::OptimConfig optim(const std::string& name, double lr) {
  config::OptimConfig cfg = default_optim_config(name);
  cfg.lr = lr;
  return cfg;
}

TEST(Optimizer, SgdMomentumWithWeightDecayOnWeightsOnly) {
  TinyImpl m;
  auto cfg = optim("sgd", 0.1);
  cfg.options.set("momentum", 0.9);
  cfg.weight_decay = 0.1;
  auto opt = make_optimizer(m, cfg);
  // step 1: d = g + wd * p = {0.6, 0.3}; buf = d; p -= lr * buf -> {0.94, -2.03}
  // step 2: d = {0.5 + 0.094, 0.5 - 0.203}; buf = 0.9 * buf + d = {1.134, 0.567}
  run_steps(m, *opt, cfg.lr, {0.5, 0.5});
  expect_values(m.weight, {0.94 - 0.1134, -2.03 - 0.0567});
  // bias without decay: buf = 0.5, then 0.95; p = 1 - 0.05 - 0.095
  expect_values(m.bias, {1.0 - 0.05 - 0.095});
}

TEST(Optimizer, SgdNesterov) {
  TinyImpl m;
  auto cfg = optim("sgd", 0.1);
  cfg.options.set("momentum", 0.9);
  cfg.options.set("nesterov", true);
  auto opt = make_optimizer(m, cfg);
  // step 1: buf = g; update = g + 0.9 * buf = 1.9 g
  run_steps(m, *opt, cfg.lr, {0.5});
  expect_values(m.weight, {1.0 - 0.1 * 0.95, -2.0 - 0.1 * 0.95});
}

TEST(Optimizer, DecayBiasAndNormPutsEverythingInOneGroup) {
  TinyImpl m;
  auto cfg = optim("sgd", 0.1);
  cfg.options.set("momentum", 0.0);
  cfg.weight_decay = 0.1;
  cfg.decay_bias_and_norm = true;
  auto groups = split_parameters(m, cfg);
  EXPECT_EQ(groups.decay.size(), 2u);
  EXPECT_TRUE(groups.no_decay.empty());
  auto opt = make_optimizer(m, cfg);
  run_steps(m, *opt, cfg.lr, {0.5});
  expect_values(m.bias, {1.0 - 0.1 * (0.5 + 0.1)});
}

TEST(Optimizer, AdamTwoSteps) {
  TinyImpl m;
  auto cfg = optim("adam", 0.01);
  auto opt = make_optimizer(m, cfg);
  run_steps(m, *opt, cfg.lr, {0.5, 0.1});
  // m_t = b1 m + (1 - b1) g, v_t = b2 v + (1 - b2) g^2, p -= lr * m^ / (sqrt(v^) + eps)
  expect_values(m.weight, {0.9819695906384652, -2.018030409361535});
  expect_values(m.bias, {0.9819695906384652});
}

TEST(Optimizer, AdamWeightDecayIsL2) {
  TinyImpl m;
  auto cfg = optim("adam", 0.01);
  cfg.weight_decay = 0.1;
  auto opt = make_optimizer(m, cfg);
  run_steps(m, *opt, cfg.lr, {0.5, 0.1});
  // g' = g + wd * p before the moments.
  expect_values(m.weight.select(1, 0), {0.981296786265348});
  expect_values(m.bias, {0.9819695906384652});
}

TEST(Optimizer, AdamWDecoupledDecaySkipsBias) {
  TinyImpl m;
  auto cfg = optim("adamw", 0.01);
  cfg.weight_decay = 0.1;
  auto opt = make_optimizer(m, cfg);
  run_steps(m, *opt, cfg.lr, {0.5, 0.1});
  // p *= 1 - lr * wd, then the Adam update.
  expect_values(m.weight, {0.9799805906382653, -2.0140224093617345});
  expect_values(m.bias, {0.9819695906384652});
}

TEST(Optimizer, StepTakesItsLearningRateInEveryGroup) {
  TinyImpl m;
  auto cfg = optim("sgd", 0.1);
  cfg.weight_decay = 0.1;
  auto opt = make_optimizer(m, cfg);
  run_steps(m, *opt, /*lr=*/0.5, {0.5});
  // weight (decayed): d = g + wd * p = {0.6, 0.3}; bias: d = g; p -= 0.5 * d
  expect_values(m.weight, {1.0 - 0.5 * 0.6, -2.0 - 0.5 * 0.3});
  expect_values(m.bias, {1.0 - 0.5 * 0.5});
}

TEST(Optimizer, TiedWeightIsUpdatedOnce) {
  TinyImpl m;
  m.register_parameter("tied", m.weight);  // the same tensor under a second name
  auto cfg = optim("sgd", 0.1);
  cfg.options.set("momentum", 0.0);
  auto groups = split_parameters(m, cfg);
  EXPECT_EQ(groups.decay.size(), 2u);  // weight (once) and bias
  auto opt = make_optimizer(m, cfg);
  run_steps(m, *opt, cfg.lr, {0.5});
  expect_values(m.weight, {1.0 - 0.05, -2.0 - 0.05});
}

TEST(Optimizer, UnknownNameListsTheRegisteredOnes) {
  TinyImpl m;
  try {
    make_optimizer(m, optim("lamb", 0.1));
    FAIL() << "expected UnknownName";
  } catch (const UnknownName& e) {
    EXPECT_STREQ(e.what(), "unknown optimizer 'lamb'; registered: adam, adamw, sgd");
  }
}

}  // namespace
}  // namespace trainer::optim
