// DDP over a real one-rank Gloo group in this process: the reducer's averaging and no_sync, and
// the message for a parameter that gets no gradient.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist/ddp.h"
#include "dist/process_group.h"
#include "launch/launcher.h"

namespace {

using trainer::dist::DataParallel;
using trainer::dist::DdpOptions;
using trainer::dist::DistEnv;
using trainer::dist::Group;

using trainer::launch::free_port;

// A free port can be taken by a test running beside this one before the store binds it: a few
// tries, each on a fresh port.
std::unique_ptr<Group> one_rank_group() {
  trainer::dist::GroupOptions options;
  options.init_timeout_s = 30;
  options.timeout_s = 30;
  for (int attempt = 1;; ++attempt) {
    DistEnv env;
    env.source = "torchrun";
    env.master_port = free_port();
    try {
      return std::make_unique<Group>(env, options);
    } catch (const trainer::dist::GroupError&) {
      if (attempt == 3) throw;
    }
  }
}

// Two layers; the second is used only when asked.
struct TwoLayersImpl : torch::nn::Module {
  TwoLayersImpl() {
    used = register_module("used", torch::nn::Linear(4, 3));
    spare = register_module("spare", torch::nn::Linear(3, 3));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_spare) {
    auto y = used(x);  // [B, 3]
    return use_spare ? spare(y) : y;
  }
  torch::nn::Linear used{nullptr}, spare{nullptr};
};
TORCH_MODULE(TwoLayers);

TEST(Ddp, GradientsOfOneRankAreItsOwnAndAccumulateUnderNoSync) {
  auto group = one_rank_group();
  TwoLayers model;
  TwoLayers reference;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      reference->parameters()[i].copy_(model->parameters()[i]);
    }
  }
  DataParallel ddp(*model, model->named_parameters().pairs(), *group, DdpOptions{});
  auto x1 = torch::randn({5, 4}), x2 = torch::randn({5, 4});
  // Two micro-batches: the first without communication (no_sync), the second syncs.
  for (int step = 0; step < 3; ++step) {
    model->zero_grad();
    reference->zero_grad();
    ddp.before_forward(/*first=*/true, /*sync=*/false);
    auto loss = model->forward(x1, true).square().mean();
    ddp.after_forward(loss, /*sync=*/false);
    loss.backward();
    ddp.before_forward(/*first=*/false, /*sync=*/true);
    loss = model->forward(x2, true).square().mean();
    ddp.after_forward(loss, /*sync=*/true);
    loss.backward();
    ddp.after_backward();
    (reference->forward(x1, true).square().mean() + reference->forward(x2, true).square().mean())
        .backward();
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      EXPECT_TRUE(torch::allclose(model->parameters()[i].grad(), reference->parameters()[i].grad(),
                                  1e-6, 1e-7))
          << "step " << step << " parameter " << i;
    }
  }
  EXPECT_GE(ddp.buckets(), 1);
}

TEST(Ddp, AParameterWithoutGradientIsNamedWithTheOption) {
  auto group = one_rank_group();
  TwoLayers model;
  DataParallel ddp(*model, model->named_parameters().pairs(), *group, DdpOptions{});
  model->zero_grad(/*set_to_none=*/true);
  ddp.before_forward(/*first=*/true, /*sync=*/true);
  auto loss = model->forward(torch::randn({2, 4}), /*use_spare=*/false).sum();
  ddp.after_forward(loss, /*sync=*/true);
  loss.backward();
  try {
    ddp.after_backward();
    FAIL() << "no error for an unused parameter";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("spare.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("dist.find_unused_parameters: true"), std::string::npos) << what;
    EXPECT_EQ(what.find("used.weight,"), std::string::npos) << what;
  }
}

TEST(Ddp, FindUnusedParametersAllowsThem) {
  auto group = one_rank_group();
  TwoLayers model;
  DdpOptions options;
  options.find_unused_parameters = true;
  DataParallel ddp(*model, model->named_parameters().pairs(), *group, options);
  for (int step = 0; step < 2; ++step) {
    model->zero_grad(/*set_to_none=*/true);
    ddp.before_forward(/*first=*/true, /*sync=*/true);
    auto loss = model->forward(torch::randn({2, 4}), /*use_spare=*/step == 1).sum();
    ddp.after_forward(loss, /*sync=*/true);
    loss.backward();
    EXPECT_NO_THROW(ddp.after_backward());
    EXPECT_TRUE(model->used->weight.grad().defined());
  }
}

TEST(Ddp, GroupCollectivesOfOneRank) {
  auto group = one_rank_group();
  EXPECT_EQ(group->world_size(), 1);
  EXPECT_EQ(group->broadcast_text("checkpoints/step_00000005.safetensors"),
            "checkpoints/step_00000005.safetensors");
  EXPECT_EQ(group->broadcast_text(""), "");
  auto t = torch::tensor({1.0f, 4.0f});
  group->all_reduce({t}, trainer::dist::Reduce::avg);
  EXPECT_TRUE(torch::equal(t, torch::tensor({1.0f, 4.0f})));
  group->barrier();
}

}  // namespace
