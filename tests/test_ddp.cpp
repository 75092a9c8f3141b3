// DDP over a real one-rank Gloo group in this process, with c10d's reducer (built alone only when
// asked) and without it (the default alone): averaging and no_sync, the message for a parameter
// that gets no gradient.
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "config/loader.h"
#include "distributed/ddp.h"
#include "distributed/process_group.h"
#include "distributed/tensor_parallel.h"
#include "engine/loop/step.h"
#include "engine/loop/trainer.h"
#include "engine/setup/components.h"
#include "temp_dir.h"
#include "util/net/net.h"

namespace {

using trainer::distributed::DataParallel;
using trainer::distributed::DdpOptions;
using trainer::distributed::DistEnv;
using trainer::distributed::Group;

using trainer::free_port;

// `start` of a one-rank job on a free port. The port can be taken by a test running beside this
// one before the store binds it: a few tries, each on a fresh port.
template <class Start>
auto on_a_free_port(Start start) {
  for (int attempt = 1;; ++attempt) {
    DistEnv env;
    env.source = "torchrun";
    env.master_port = free_port();
    try {
      return start(env);
    } catch (const trainer::distributed::GroupError&) {
      if (attempt == 3) throw;
    }
  }
}

std::unique_ptr<Group> one_rank_group() {
  trainer::distributed::GroupOptions options;
  options.init_timeout_s = 30;
  options.timeout_s = 30;
  return on_a_free_port([&](const DistEnv& env) { return std::make_unique<Group>(env, options); });
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

// Each test runs with the reducer (as in a larger group) and without it (a group of one's default).
class DdpAlone : public ::testing::TestWithParam<bool> {
 protected:
  DdpOptions options() const {
    DdpOptions o;
    o.reducer_at_world_size_1 = GetParam();
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Ddp, DdpAlone, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WithReducer" : "WithoutReducer";
                         });

TEST_P(DdpAlone, GradientsOfOneRankAreItsOwnAndAccumulateUnderNoSync) {
  auto group = one_rank_group();
  TwoLayers model;
  TwoLayers reference;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      reference->parameters()[i].copy_(model->parameters()[i]);
    }
  }
  DataParallel ddp(*model, model->named_parameters().pairs(), *group, options());
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
    // The reducer's gradients are views into its buckets; without it they are autograd's own.
    EXPECT_EQ(model->used->weight.grad().is_alias_of(model->spare->weight.grad()), GetParam());
  }
  if (GetParam()) {
    EXPECT_GE(ddp.buckets(), 1);
  } else {
    EXPECT_EQ(ddp.buckets(), 0);
  }
}

TEST_P(DdpAlone, AParameterWithoutGradientIsNamedWithTheOption) {
  auto group = one_rank_group();
  TwoLayers model;
  DataParallel ddp(*model, model->named_parameters().pairs(), *group, options());
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

TEST_P(DdpAlone, FindUnusedParametersAllowsThem) {
  auto group = one_rank_group();
  TwoLayers model;
  DdpOptions o = options();
  o.find_unused_parameters = true;
  DataParallel ddp(*model, model->named_parameters().pairs(), *group, o);
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
  group->all_reduce({t}, trainer::distributed::Reduce::avg);
  EXPECT_TRUE(torch::equal(t, torch::tensor({1.0f, 4.0f})));
  group->barrier();
}

// The ATen operators this thread runs while an OperatorCount lives, by name.
class OperatorCount {
 public:
  OperatorCount() {
    counts() = {};
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction& fn)
                                       -> std::unique_ptr<at::ObserverContext> {
          ++counts()[fn.name()];
          return nullptr;
        }).scopes({at::RecordScope::FUNCTION}));
  }
  ~OperatorCount() { at::removeCallback(handle_); }
  OperatorCount(const OperatorCount&) = delete;
  OperatorCount& operator=(const OperatorCount&) = delete;

  static std::map<std::string, int64_t>& counts() {
    thread_local std::map<std::string, int64_t> by_name;
    return by_name;
  }

 private:
  at::CallbackHandle handle_;
};

// "name: plain count -> launched count" for each operator whose counts differ.
std::string differences(const std::map<std::string, int64_t>& a,
                        const std::map<std::string, int64_t>& b) {
  std::map<std::string, std::pair<int64_t, int64_t>> both;
  for (const auto& [name, n] : a) both[name].first = n;
  for (const auto& [name, n] : b) both[name].second = n;
  std::string out;
  for (const auto& [name, n] : both) {
    if (n.first != n.second) {
      out += name + ": " + std::to_string(n.first) + " -> " + std::to_string(n.second) + "\n";
    }
  }
  return out;
}

// A job of one process trains without the reducer: its steps run exactly the operators of a plain
// run's steps (with the reducer, the copies into its buckets and its bookkeeping come on top).
TEST(DdpEngine, AJobOfOneRunsThePlainStepsOperators) {
  trainer::test_support::TempDir tmp("ddp_engine");
  const auto path = tmp / "run.yaml";
  std::ofstream(path) << "seed: 3\ndevice: cpu\nmodel: {name: mlp, hidden: [32, 16]}\n"
                         "data: {name: synthetic, shape: [24], num_classes: 4, "
                         "train_samples: 64, val_samples: 16, batch_size: 8, workers: 0}\n"
                         "train: {grad_accum_steps: 2}\noptim: {name: sgd, momentum: 0.9}\n"
                         "run: {threads: 1, progress: never, dir: "
                      << (tmp / "out").string() << "}\n";
  // Operators of three steps after a first (which sets buckets up) by a trainer for `job`.
  auto step_operators = [&](const DistEnv& job, bool reducer) {
    auto loaded = trainer::engine::load_config(
        path.string(),
        {std::string("dist.reducer_at_world_size_1=") + (reducer ? "true" : "false")});
    trainer::config::check(loaded, trainer::config::Environment{});
    trainer::engine::Trainer trainer(loaded, job);
    trainer::engine::StepObserver quiet;
    trainer.run_steps(/*steps=*/1, quiet, /*fixed_batch=*/true);
    OperatorCount count;
    trainer.run_steps(/*steps=*/3, quiet, /*fixed_batch=*/true);
    return OperatorCount::counts();
  };
  const auto plain = step_operators(DistEnv{}, false);
  ASSERT_GT(plain.count("aten::addmm"), 0u);
  for (const bool reducer : {false, true}) {
    SCOPED_TRACE(reducer ? "with the reducer" : "without the reducer");
    const auto launched =
        on_a_free_port([&](const DistEnv& env) { return step_operators(env, reducer); });
    const std::string diff = differences(plain, launched);
    if (reducer) {
      EXPECT_NE(diff, "");
    } else {
      EXPECT_EQ(diff, "");
    }
    std::cout << (reducer ? "with" : "without") << " the reducer:\n" << diff;
  }
}

}  // namespace

namespace {

namespace tpx = trainer::distributed;

// Runs `body(group, rank)` on each of `world` ranks of one job in this process, a thread each;
// returns each rank's error ("" when none).
std::vector<std::string> on_ranks(int world, const std::function<void(Group&, int)>& body) {
  trainer::distributed::GroupOptions options;
  options.init_timeout_s = 30;
  options.timeout_s = 30;
  const int port = free_port();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        DistEnv env;
        env.source = "torchrun";
        env.rank = r;
        env.world_size = world;
        env.master_port = port;
        Group group(env, options);
        body(group, r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Four ranks: tensor-parallel groups of consecutive ranks ({0, 1}, {2, 3}) and data-parallel
// groups across them ({0, 2}, {1, 3}), each all-reducing and all-gathering its own members' values
// only, and counting what it moved.
TEST(Group, SubGroupsOfConsecutiveAndStridedRanksReduceTheirMembersOnly) {
  std::vector<double> tp_sum(4), dp_sum(4);
  std::vector<std::vector<double>> tp_gathered(4);
  std::vector<int64_t> tp_bytes(4), world_bytes(4);
  const auto errors = on_ranks(4, [&](Group& world, int r) {
    const int first = r / 2 * 2;
    Group tp(world, {first, first + 1}, "tp" + std::to_string(r / 2));
    Group dp(world, {r % 2, r % 2 + 2}, "dp" + std::to_string(r % 2));
    EXPECT_EQ(tp.rank(), r % 2);
    EXPECT_EQ(dp.rank(), r / 2);
    auto a = torch::full({3}, static_cast<double>(r + 1), torch::kDouble);
    auto b = a.clone();
    tp.all_reduce({a}, tpx::Reduce::sum);
    dp.all_reduce({b}, tpx::Reduce::sum);
    tp_sum[r] = a[0].item<double>();
    dp_sum[r] = b[0].item<double>();
    std::vector<torch::Tensor> parts = {torch::empty({1}, torch::kDouble),
                                        torch::empty({1}, torch::kDouble)};
    tp.all_gather(torch::full({1}, static_cast<double>(10 * r), torch::kDouble), parts);
    for (const auto& p : parts) tp_gathered[r].push_back(p.item<double>());
    tp_bytes[r] = tp.communicated().total();
    world_bytes[r] = world.communicated().total();
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(tp_sum[r], r < 2 ? 1 + 2 : 3 + 4) << "rank " << r;
    EXPECT_EQ(dp_sum[r], r % 2 == 0 ? 1 + 3 : 2 + 4) << "rank " << r;
    const double first = 10.0 * (r / 2 * 2);
    EXPECT_EQ(tp_gathered[r], (std::vector<double>{first, first + 10})) << "rank " << r;
    EXPECT_EQ(tp_bytes[r], 3 * 8 + 2 * 8) << "rank " << r;  // the all-reduce's and the gather's
    EXPECT_EQ(world_bytes[r], 0) << "rank " << r;
  }
}

// Two ranks decide every step alike: a loss inf/NaN on one rank makes the step bad on both (and
// leaves both ranks' losses and gradient norms out of the window), one rank's stop request stops
// both; checked against ATen on the ranks' summed loss.
TEST(StepFlags, TwoRanksAgreeOnABadLossAndAStop) {
  const std::vector<std::vector<float>> losses = {
      {1.0f, 2.0f}, {1.5f, NAN}, {3.0f, 4.0f}, {INFINITY, 0.5f}, {2.0f, 2.0f}};
  const std::vector<std::vector<bool>> stops = {
      {false, false}, {false, false}, {false, true}, {false, false}, {false, false}};
  std::vector<std::vector<trainer::engine::StepOutcome>> outcomes(2);
  std::vector<std::vector<float>> windows(2);
  const auto errors = on_ranks(2, [&](Group& group, int r) {
    trainer::engine::StepFlags flags;
    trainer::engine::TrainingState state;
    for (size_t s = 0; s < losses.size(); ++s) {
      const auto loss = torch::tensor(losses[s][r]), norm = torch::tensor(0.25f * (r + 1));
      flags.start(loss, stops[s][r], &group);
      const auto d = flags.decide(loss, torch::tensor(0.0f), /*skip_bad=*/true, nullptr, norm);
      trainer::engine::add_to_window(state, d);
      flags.queue(static_cast<int64_t>(s) + 1);
      outcomes[r].push_back(flags.read());
      windows[r].push_back(state.window_loss.item<float>());
      windows[r].push_back(state.window_grad_norm.item<float>());
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    float window_loss = 0, window_norm = 0;
    for (size_t s = 0; s < losses.size(); ++s) {
      SCOPED_TRACE(testing::Message() << "rank " << r << ", step " << s);
      const bool bad = !torch::tensor(losses[s][0] + losses[s][1]).isfinite().item<bool>();
      const auto& out = outcomes[r][s];
      EXPECT_EQ(out.bad_loss, bad);
      EXPECT_EQ(out.skipped, bad);
      EXPECT_EQ(out.stop, stops[s][0] || stops[s][1]);
      if (!bad) {
        window_loss += losses[s][r];
        window_norm += 0.25f * (r + 1);
      }
      EXPECT_EQ(windows[r][2 * s], window_loss);
      EXPECT_EQ(windows[r][2 * s + 1], window_norm);
    }
  }
}

// A two-layer MLP split Megatron's way over a group of two (the first layer's rows, the second's
// columns): forward and backward equal the whole layers', each rank's weight gradients the
// slices of the whole ones, with one all-reduce each way.
TEST(TensorParallel, AColumnThenRowParallelMlpEqualsTheWholeOne) {
  torch::manual_seed(7);
  auto fc1 = torch::nn::Linear(8, 16), fc2 = torch::nn::Linear(16, 8);
  auto x = torch::randn({5, 8}, torch::kDouble);
  fc1->to(torch::kDouble);
  fc2->to(torch::kDouble);
  auto xw = x.clone().requires_grad_();
  const auto whole = fc2(torch::gelu(fc1(xw)));  // [5, 8]
  whole.square().sum().backward();

  std::vector<torch::Tensor> out(2), dx(2), dw1(2), db1(2), dw2(2);
  std::vector<int64_t> moved(2);
  const auto errors = on_ranks(2, [&](Group& world, int r) {
    Group tp(world, {0, 1}, "tp");
    auto w1 =
        trainer::split_part(fc1->weight.detach(), {0, 1}, r, 2).clone().requires_grad_();  // [8, 8]
    auto b1 =
        trainer::split_part(fc1->bias.detach(), {0, 1}, r, 2).clone().requires_grad_();  // [8]
    auto w2 =
        trainer::split_part(fc2->weight.detach(), {1, 1}, r, 2).clone().requires_grad_();  // [8, 8]
    auto xr = x.clone().requires_grad_();
    auto h = torch::gelu(torch::nn::functional::linear(tpx::copy_to_group(xr, tp), w1, b1));
    auto y = tpx::reduce_from_group(torch::nn::functional::linear(h, w2), tp) +
             fc2->bias.detach();  // the row-parallel layer's bias, added once
    y.square().sum().backward();
    out[r] = y.detach();
    dx[r] = xr.grad();
    dw1[r] = w1.grad();
    db1[r] = b1.grad();
    dw2[r] = w2.grad();
    moved[r] = tp.communicated().all_reduce;
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_TRUE(torch::allclose(out[r], whole.detach(), 1e-12, 1e-12)) << "rank " << r;
    EXPECT_TRUE(torch::allclose(dx[r], xw.grad(), 1e-12, 1e-12)) << "rank " << r;
    EXPECT_TRUE(torch::allclose(dw1[r], trainer::split_part(fc1->weight.grad(), {0, 1}, r, 2),
                                1e-12, 1e-12));
    EXPECT_TRUE(
        torch::allclose(db1[r], trainer::split_part(fc1->bias.grad(), {0, 1}, r, 2), 1e-12, 1e-12));
    EXPECT_TRUE(torch::allclose(dw2[r], trainer::split_part(fc2->weight.grad(), {1, 1}, r, 2),
                                1e-12, 1e-12));
    EXPECT_EQ(moved[r], 2 * 5 * 8 * 8);  // the output's all-reduce and the input gradient's
  }
  EXPECT_THROW(trainer::split_part(torch::zeros({6}), {0, 1}, 0, 4), std::invalid_argument);
}

// A vocabulary of 12 split over two ranks: the embedding lookup and the cross-entropy computed on
// each rank's half of the table and of the logits equal the whole ones, values and gradients.
TEST(TensorParallel, VocabularyParallelEmbeddingAndCrossEntropyEqualTheWholeOnes) {
  torch::manual_seed(11);
  const auto table = torch::randn({12, 4}, torch::kDouble);   // [V, C]
  const auto logits = torch::randn({6, 12}, torch::kDouble);  // [N, V]
  const auto ids = torch::tensor({0, 5, 6, 11, 3, 8}, torch::kLong);
  auto tw = table.clone().requires_grad_();
  auto lw = logits.clone().requires_grad_();
  const auto emb = torch::embedding(tw, ids);  // [N, C]
  (emb.square().sum() + torch::nn::functional::cross_entropy(lw, ids)).backward();

  std::vector<torch::Tensor> embs(2), losses(2), dtable(2), dlogits(2);
  const auto errors = on_ranks(2, [&](Group& tp, int r) {
    auto t = trainer::split_part(table, {0, 1}, r, 2).clone().requires_grad_();   // [V/2, C]
    auto l = trainer::split_part(logits, {1, 1}, r, 2).clone().requires_grad_();  // [N, V/2]
    const auto e = tpx::vocab_parallel_embedding(ids, t, 6 * r, tp);
    const auto loss = tpx::vocab_parallel_cross_entropy(l, ids, 6 * r, tp).mean();
    (e.square().sum() + loss).backward();
    embs[r] = e.detach();
    losses[r] = loss.detach();
    dtable[r] = t.grad();
    dlogits[r] = l.grad();
  });
  const auto whole_loss = torch::nn::functional::cross_entropy(logits, ids);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_TRUE(torch::allclose(embs[r], emb.detach(), 1e-12, 1e-12)) << "rank " << r;
    EXPECT_NEAR(losses[r].item<double>(), whole_loss.item<double>(), 1e-12) << "rank " << r;
    EXPECT_TRUE(
        torch::allclose(dtable[r], trainer::split_part(tw.grad(), {0, 1}, r, 2), 1e-12, 1e-12));
    EXPECT_TRUE(
        torch::allclose(dlogits[r], trainer::split_part(lw.grad(), {1, 1}, r, 2), 1e-12, 1e-12))
        << "rank " << r;
  }
}

// Targets left out (-100, PyTorch's ignore_index): a loss of 0 and no gradient on either rank's
// half of the logits, the others' losses and gradients those of the whole logits.
TEST(TensorParallel, VocabularyParallelCrossEntropyLeavesIgnoredTargetsOut) {
  namespace F = torch::nn::functional;
  torch::manual_seed(12);
  const auto logits = torch::randn({6, 12}, torch::kDouble);  // [N, V]
  const auto ids = torch::tensor({0, -100, 6, -100, 11, 8}, torch::kLong);
  const auto kept = ids.ne(-100).sum().to(torch::kDouble);
  auto lw = logits.clone().requires_grad_();
  F::cross_entropy(lw, ids).backward();  // the mean over the kept targets
  const auto each =
      F::cross_entropy(logits, ids, F::CrossEntropyFuncOptions().reduction(torch::kNone));  // [N]

  std::vector<torch::Tensor> losses(2), dlogits(2);
  const auto errors = on_ranks(2, [&](Group& tp, int r) {
    auto l = trainer::split_part(logits, {1, 1}, r, 2).clone().requires_grad_();  // [N, V/2]
    const auto token = tpx::vocab_parallel_cross_entropy(l, ids, 6 * r, tp);      // [N]
    (token.sum() / kept).backward();
    losses[r] = token.detach();
    dlogits[r] = l.grad();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_TRUE(torch::allclose(losses[r], each, 1e-12, 1e-12)) << "rank " << r;
    EXPECT_TRUE(
        torch::allclose(dlogits[r], trainer::split_part(lw.grad(), {1, 1}, r, 2), 1e-12, 1e-12))
        << "rank " << r;
    EXPECT_EQ(dlogits[r].index({1}).abs().sum().item<double>(), 0.0) << "rank " << r;
  }
}

}  // namespace
