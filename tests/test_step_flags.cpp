// The step's skip decision (StepFlags): the same flags and window values as ATen's compositions of
// each step's inputs, no allocation in a step, and the operators a fused update dispatches.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <numeric>
#include <vector>

#include "engine/loop/spike_guard.h"
#include "engine/loop/step.h"
#include "engine/measure/memory.h"
#include "engine/use/bench.h"
#include "engine_fixture.h"

namespace trainer::engine {
namespace {

// Equal, or both NaN.
bool same(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.isnan().logical_and(b.isnan())).logical_or(a.eq(b)).all().item<bool>();
}

struct Inputs {
  bool skip_bad, scaler, norm, guard;
};

// One StepFlags over steps of finite and inf/NaN losses, found_inf and gradient norms, checked
// step by step against: bad = skip_bad and not isfinite(loss), skip = max(bad, found_inf, the
// spike a guard of its own finds), the window's sums of where(bad, 0, value).
void check_steps(const Inputs& in) {
  SCOPED_TRACE(testing::Message() << "skip_bad " << in.skip_bad << ", scaler " << in.scaler
                                  << ", norm " << in.norm << ", guard " << in.guard);
  const float nan = NAN, inf = INFINITY;
  const std::vector<float> losses = {1.5f, nan, 2.0f, inf, 2.5f, -inf, 3.0f, 1.0f, 9.0f};
  const std::vector<float> found = {0, 0, 1, 0, 1, 1, 0, 0, 0};
  const std::vector<float> norms = {0.5f, 2.0f, nan, 1.0f, inf, 3.0f, 1.0f, 0.7f, 8.0f};
  config::ZScoreConfig zcfg;
  zcfg.loss = 1.0;
  zcfg.grad_norm = in.norm ? 1.0 : 0.0;
  zcfg.window = 2;
  SpikeGuard guard(zcfg, torch::kCPU), reference_guard(zcfg, torch::kCPU);
  StepFlags flags;
  TrainingState state, reference;
  reference.window_loss = torch::zeros({});
  reference.window_grad_norm = torch::zeros({});
  for (size_t s = 0; s < losses.size(); ++s) {
    SCOPED_TRACE(s);
    const auto loss = torch::tensor(losses[s]);
    const auto found_inf = in.scaler ? torch::tensor(found[s]) : torch::Tensor();
    const auto norm = in.norm ? torch::tensor(norms[s]) : torch::Tensor();
    flags.start(loss, false, nullptr);
    const auto d = flags.decide(loss, found_inf, in.skip_bad, in.guard ? &guard : nullptr, norm);
    add_to_window(state, d);
    flags.queue(static_cast<int64_t>(s) + 1);
    const auto out = flags.read();

    const auto bad = in.skip_bad ? loss.isfinite().logical_not() : torch::tensor(false);
    auto skip = bad.to(torch::kFloat);
    if (in.scaler) skip = torch::maximum(skip, found_inf);
    torch::Tensor z = torch::zeros({2});
    if (in.guard) skip = torch::maximum(skip, reference_guard.check(loss, norm, z));
    reference.window_loss += torch::where(bad, torch::zeros({}), loss);
    if (in.norm) reference.window_grad_norm += torch::where(bad, torch::zeros({}), norm);

    EXPECT_EQ(out.step, static_cast<int64_t>(s) + 1);
    EXPECT_EQ(out.bad_loss, bad.item<bool>());
    EXPECT_EQ(out.skipped, skip.item<float>() != 0.0f);
    EXPECT_EQ(d.skip.item<float>(), skip.item<float>());  // the fused kernels' found_inf
    EXPECT_FALSE(out.stop);
    if (in.guard) {
      EXPECT_EQ(out.z_loss, z[0].item<float>());
      EXPECT_EQ(out.z_grad_norm, z[1].item<float>());
    }
    EXPECT_TRUE(same(state.window_loss, reference.window_loss))
        << state.window_loss << " vs " << reference.window_loss;
    if (in.norm) EXPECT_TRUE(same(state.window_grad_norm, reference.window_grad_norm));
    EXPECT_EQ(state.window_grad_norm.defined(), in.norm);
  }
}

TEST(StepFlags, DecideAsAtenCompositionsStepAfterStep) {
  for (const bool skip_bad : {true, false}) {
    for (const bool scaler : {false, true}) {
      for (const bool norm : {false, true}) {
        for (const bool guard : {false, true}) check_steps({skip_bad, scaler, norm, guard});
      }
    }
  }
}

// After the first step, which makes its buffers, a step's decision, window sums and flag copy
// allocate nothing.
TEST(StepFlags, StepsAfterTheFirstAllocateNothing) {
  for (const bool norm : {false, true}) {
    SCOPED_TRACE(norm ? "with a gradient norm" : "no gradient norm");
    StepFlags flags;
    TrainingState state;
    const auto loss = torch::tensor(2.0f), found_inf = torch::tensor(0.0f);
    const auto grad_norm = norm ? torch::tensor(1.0f) : torch::Tensor();
    auto step = [&] {
      add_to_window(state, flags.decide(loss, found_inf, /*skip_bad=*/true, nullptr, grad_norm));
      flags.queue(1);
      flags.read();
    };
    step();
    EXPECT_EQ(measure_cpu_peak(step), 0);
  }
}

// ResNet-18 with fused SGD (two parameter groups), as `trainer bench` counts its optimizer phase
// (ops_by_name): the skip decision, the window's sum, the flags' copy and the kernels, at most 8
// operators a step, none of them one that allocates, and no host read.
TEST_F(EngineTest, FusedResNet18UpdateDispatchesAtMostEightOperators) {
  for (const char* max_bad : {"train.max_bad_steps=20", "train.max_bad_steps=0"}) {
    SCOPED_TRACE(max_bad);
    Trainer trainer(load({"model.name=resnet18", "model.stem=cifar", "model.num_classes=0",
                          "data.shape=[3,32,32]", "data.num_classes=10", "data.batch_size=4",
                          "optim.name=sgd", "optim.momentum=0.9", "optim.nesterov=true",
                          "optim.weight_decay=0.0005", "optim.impl=fused", max_bad}));
    BenchOptions options;
    options.warmup = 1;
    options.steps = 1;
    options.counted = 3;
    const auto r = run_bench(trainer, options);
    const auto& ops = r.ops_by_name.at("optimizer");
    double total = 0;
    for (const auto& [name, per_step] : ops) {
      std::cout << "  " << name << " " << per_step << "\n";
      total += per_step;
    }
    EXPECT_EQ(total, r.ops_per_step.at("optimizer"));
    EXPECT_LE(total, 8.0);
    EXPECT_EQ(ops.at("aten::_fused_sgd_"), 2.0);  // one kernel per parameter group
    for (const char* allocates : {"aten::zeros", "aten::zeros_like", "aten::empty", "aten::stack",
                                  "aten::cat", "aten::to", "aten::isfinite"}) {
      EXPECT_EQ(ops.count(allocates), 0u) << allocates;
    }
    EXPECT_EQ(r.host_syncs_per_step, 0.0);
  }
}

}  // namespace
}  // namespace trainer::engine
