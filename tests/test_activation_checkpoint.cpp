// Activation checkpointing: the recomputation gives the same results and gradients as the plain
// forward (dropout, batch norm, autocast), keeps less memory, and the models apply it per block.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/measure/memory.h"
#include "models/model.h"
#include "nn/activation_checkpoint.h"
#include "nn/autocast.h"

namespace trainer::nn {
namespace {

// A small block with dropout, so the recomputation must replay the random numbers.
struct DropBlockImpl : torch::nn::Module {
  DropBlockImpl() { fc = register_module("fc", torch::nn::Linear(6, 6)); }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::dropout(torch::tanh(fc->forward(x)), /*p=*/0.5, /*train=*/true) + x;
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(DropBlock);

// Gradients of every parameter of `module`, cloned.
std::vector<torch::Tensor> grads_of(const torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  for (const auto& p : module.parameters()) out.push_back(p.grad().clone());
  return out;
}

void expect_bitwise_equal(const std::vector<torch::Tensor>& a,
                          const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << "tensor " << i;
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i << " differs";
  }
}

TEST(ActivationCheckpointTest, DropoutMasksAndGradientsMatchThePlainForward) {
  DropBlock block;
  auto run = [&](bool checkpointed) {
    torch::manual_seed(7);
    block->zero_grad();
    auto x = torch::randn({4, 6}, torch::requires_grad());
    auto fn = [block](const torch::Tensor& in) mutable { return block->forward(in); };
    auto y = checkpointed ? checkpoint(*block, fn, x) : fn(x);
    y.pow(2).sum().backward();
    auto grads = grads_of(*block);
    grads.push_back(x.grad().clone());
    grads.push_back(y.detach());
    grads.push_back(torch::rand({3}));  // the generator after backward: no extra draws
    return grads;
  };
  expect_bitwise_equal(run(false), run(true));
}

TEST(ActivationCheckpointTest, OffloadedInputsLeaveAndComeBackUnchanged) {
  DropBlock block;
  auto run = [&](bool offload) {
    torch::manual_seed(7);
    block->zero_grad();
    auto x = torch::randn({4, 6}, torch::requires_grad());
    auto fn = [block](const torch::Tensor& in) mutable { return block->forward(in); };
    const int64_t before = offloaded_bytes();
    auto y = checkpoint(*block, fn, x * 1.0, offload);  // [4, 6]
    EXPECT_EQ(offloaded_bytes() - before, offload ? 4 * 6 * 4 : 0);
    y.pow(2).sum().backward();
    auto grads = grads_of(*block);
    grads.push_back(x.grad().clone());
    grads.push_back(y.detach());
    return grads;
  };
  expect_bitwise_equal(run(false), run(true));
  // The backward reruns from the host copy, not from the input: changed after forward, the
  // input's new values do not reach the gradients (without offload autograd refuses the change).
  torch::manual_seed(3);
  auto x = torch::randn({4, 6}, torch::requires_grad());
  auto in = x * 1.0;
  auto fn = [block](const torch::Tensor& t) mutable { return block->forward(t); };
  block->zero_grad();
  auto y = checkpoint(*block, fn, in, /*offload=*/true);
  {
    torch::NoGradGuard no_grad;
    in.add_(100.0);
  }
  y.pow(2).sum().backward();
  const auto offloaded = grads_of(*block);
  torch::manual_seed(3);
  auto x2 = torch::randn({4, 6}, torch::requires_grad());
  block->zero_grad();
  checkpoint(*block, fn, x2 * 1.0).pow(2).sum().backward();
  expect_bitwise_equal(offloaded, grads_of(*block));
}

TEST(ActivationCheckpointTest, ParametersGetGradientsWhenNoInputRequiresThem) {
  DropBlock block;
  torch::manual_seed(1);
  const auto x = torch::randn({4, 6});  // a constant input
  auto y = checkpoint(
      *block, [block](const torch::Tensor& in) mutable { return block->forward(in); }, x);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  for (const auto& p : block->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0);
  }
}

TEST(ActivationCheckpointTest, SeveralInputsAndOutputsOneOfThemUnused) {
  torch::nn::Linear lin(3, 3);
  auto fn = [lin](const TensorList& in) mutable {
    auto h = lin->forward(in[0]) * in[1];                     // [2, 3]
    return TensorList{h.sum(/*dim=*/1), h.exp(), in[2] * 2};  // [2], [2, 3], [2]
  };
  auto run = [&](bool checkpointed) {
    torch::manual_seed(3);
    lin->zero_grad();
    auto a = torch::randn({2, 3}, torch::requires_grad());
    auto b = torch::randn({2, 3}, torch::requires_grad());
    auto c = torch::randn({2});  // needs no gradient
    auto out = checkpointed ? checkpoint(*lin, fn, {a, b, c}) : fn({a, b, c});
    EXPECT_EQ(out.size(), 3u);
    (out[0] * 3).sum().backward();  // out[1] and out[2] unused
    return std::vector<torch::Tensor>{a.grad().clone(), b.grad().clone(),
                                      lin->weight.grad().clone(), lin->bias.grad().clone()};
  };
  expect_bitwise_equal(run(false), run(true));
}

TEST(ActivationCheckpointTest, BatchNormStatisticsUpdateOnce) {
  torch::nn::BatchNorm1d plain(4), checkpointed(4);
  torch::manual_seed(2);
  const auto x = torch::randn({8, 4}, torch::requires_grad());
  plain->forward(x).sum().backward();
  checkpoint(
      *checkpointed,
      [checkpointed](const torch::Tensor& in) mutable { return checkpointed->forward(in); }, x)
      .sum()
      .backward();
  EXPECT_TRUE(torch::equal(plain->running_mean, checkpointed->running_mean));
  EXPECT_TRUE(torch::equal(plain->running_var, checkpointed->running_var));
  EXPECT_EQ(checkpointed->num_batches_tracked.item<int64_t>(), 1);
}

TEST(ActivationCheckpointTest, RecomputationUsesTheForwardsAutocast) {
  torch::nn::Linear lin(5, 5);
  auto fn = [lin](const torch::Tensor& in) mutable { return torch::relu(lin->forward(in)); };
  auto run = [&](bool checkpointed) {
    torch::manual_seed(4);
    lin->zero_grad();
    auto x = torch::randn({3, 5}, torch::requires_grad());
    torch::Tensor y;
    {
      AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
      y = checkpointed ? checkpoint(*lin, fn, x) : fn(x);
    }
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    y.to(torch::kFloat).sum().backward();  // backward runs outside autocast
    return std::vector<torch::Tensor>{x.grad().clone(), lin->weight.grad().clone()};
  };
  expect_bitwise_equal(run(false), run(true));
}

TEST(ActivationCheckpointTest, WithoutGradModeItIsAPlainCall) {
  DropBlock block;
  torch::NoGradGuard no_grad;
  auto y = checkpoint(
      *block, [block](const torch::Tensor& in) mutable { return block->forward(in); },
      torch::randn({2, 6}));
  EXPECT_FALSE(y.requires_grad());
}

TEST(ActivationCheckpointTest, KeepsLessMemoryThanThePlainForward) {
  // 8 residual blocks 64 -> 512 -> 64 on 4096 rows: each keeps an 8 MiB hidden activation in a
  // plain forward; checkpointed, only the 1 MiB block inputs stay until backward.
  std::vector<torch::nn::Sequential> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(torch::nn::Sequential(torch::nn::Linear(64, 512), torch::nn::Tanh(),
                                           torch::nn::Linear(512, 64)));
  }
  const auto x = torch::randn({4096, 64}, torch::requires_grad());
  auto peak = [&](bool checkpointed) {
    for (auto& b : blocks) b->zero_grad(/*set_to_none=*/true);
    return engine::measure_cpu_peak([&] {
      auto h = x;
      for (auto& b : blocks) {
        auto fn = [b](const torch::Tensor& in) mutable { return in + b->forward(in); };
        h = checkpointed ? checkpoint(*b, fn, h) : fn(h);
      }
      h.sum().backward();
    });
  };
  peak(false);  // first-use allocations out of the way
  const int64_t plain = peak(false), checkpointed = peak(true);
  EXPECT_LT(checkpointed, plain / 2) << plain << " vs " << checkpointed;
}

TEST(CheckpointPolicyTest, SelectsEveryNthBlock) {
  CheckpointPolicy none(0), all(1), every3(3);
  EXPECT_FALSE(none.any());
  EXPECT_FALSE(none.applies(0));
  for (int64_t i = 0; i < 6; ++i) EXPECT_TRUE(all.applies(i));
  EXPECT_FALSE(every3.applies(0));
  EXPECT_FALSE(every3.applies(1));
  EXPECT_TRUE(every3.applies(2));
  EXPECT_TRUE(every3.applies(5));
  EXPECT_FALSE(every3.applies(6));
}

// Checkpointed and plain copies of one model train identically: bitwise-equal gradients after the
// first backward, and equal losses over 5 SGD steps.
void expect_same_training(config::ModelConfig cfg, const models::InputSpec& input,
                          const std::function<torch::Tensor()>& make_inputs,
                          const std::function<torch::Tensor(const torch::Tensor&)>& make_targets,
                          const std::string& checkpointing) {
  auto build = [&](const std::string& mode) {
    cfg.checkpointing = mode;
    torch::manual_seed(11);
    return models::build_model(cfg, input);
  };
  auto plain = build("none"), checkpointed = build(checkpointing);
  torch::manual_seed(12);
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 5; ++i) {
    xs.push_back(make_inputs());
    ys.push_back(make_targets(xs.back()));
  }
  torch::optim::SGD opt_a(plain->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD opt_b(checkpointed->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < 5; ++step) {
    auto loss_of = [&](models::Net& net, torch::optim::SGD& opt, uint64_t seed) {
      opt.zero_grad();
      torch::manual_seed(seed);  // dropout draws the same numbers in both
      auto logits = net->forward(xs[static_cast<size_t>(step)]);
      auto loss = torch::nn::functional::cross_entropy(logits.flatten(0, -2),
                                                       ys[static_cast<size_t>(step)].flatten());
      loss.backward();
      return loss.item<float>();
    };
    const float a = loss_of(plain, opt_a, 100 + step);
    const float b = loss_of(checkpointed, opt_b, 100 + step);
    EXPECT_EQ(a, b) << "step " << step;
    if (step == 0) expect_bitwise_equal(grads_of(*plain), grads_of(*checkpointed));
    opt_a.step();
    opt_b.step();
  }
  expect_bitwise_equal(plain->buffers(), checkpointed->buffers());
}

TEST(ActivationCheckpointTest, Resnet18TrainsAsWithout) {
  config::ModelConfig cfg = models::default_model_config();
  cfg.name = "resnet18";
  cfg.options.set("stem", "cifar");
  expect_same_training(
      cfg, models::InputSpec{{3, 32, 32}, 10},
      [] {
        return torch::randn({2, 3, 32, 32});
      },
      [](const torch::Tensor&) { return torch::randint(/*high=*/10, {2}); }, "blocks");
}

TEST(ActivationCheckpointTest, GptWithDropoutTrainsAsWithout) {
  config::ModelConfig cfg = models::default_model_config();
  cfg.name = "gpt";
  cfg.options.set("n_layer", int64_t{4});
  cfg.options.set("n_head", int64_t{2});
  cfg.options.set("n_embd", int64_t{32});
  cfg.options.set("block_size", int64_t{16});
  cfg.options.set("vocab_size", int64_t{40});
  cfg.options.set("dropout", 0.1);
  for (const std::string mode : {"blocks", "every:2", "offload"}) {
    SCOPED_TRACE(mode);
    expect_same_training(
        cfg, models::InputSpec{{16}, 40},
        [] {
          return torch::randint(/*high=*/40, {3, 16});
        },
        [](const torch::Tensor& x) { return x.roll(/*shifts=*/-1, /*dims=*/1); }, mode);
  }
}

TEST(ActivationCheckpointTest, VitTrainsAsWithout) {
  config::ModelConfig cfg = models::default_model_config("vit");
  cfg.options.set("patch_size", int64_t{4});
  cfg.options.set("embed_dim", int64_t{16});
  cfg.options.set("depth", int64_t{3});
  cfg.options.set("num_heads", int64_t{2});
  cfg.options.set("dropout", 0.1);
  expect_same_training(
      cfg, models::InputSpec{{3, 8, 8}, 5},
      [] {
        return torch::randn({2, 3, 8, 8});
      },
      [](const torch::Tensor&) { return torch::randint(/*high=*/5, {2}); }, "blocks");
}

TEST(ActivationCheckpointTest, ModelsWithoutBlocksRejectIt) {
  config::ModelConfig cfg = models::default_model_config();
  cfg.name = "mlp";
  cfg.checkpointing = "blocks";
  try {
    models::build_model(cfg, models::InputSpec{{12}, 3});
    FAIL() << "expected a ModelError";
  } catch (const models::ModelError& e) {
    EXPECT_EQ(e.key(), "model.checkpointing");
    EXPECT_NE(std::string(e.what()).find("no blocks to checkpoint"), std::string::npos);
  }
}

}  // namespace
}  // namespace trainer::nn
