// train.rollback_on_nan when the loss stays bad: rollbacks go further back, keep what they may
// need, are limited, and a run that cannot get past its inf/NaN losses ends with exit 1; a state
// whose loss is inf/NaN is never saved.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <set>
#include <stdexcept>

#include "checkpoint/checkpoint.h"
#include "engine_fixture.h"

namespace trainer::engine {
namespace {

class RollbackTest : public EngineTest {
 protected:
  // A run of 16 steps with a checkpoint every 4 and one kept (unless `extra` says otherwise).
  config::LoadedConfig run(const std::vector<std::string>& extra) {
    std::vector<std::string> sets = {"train.max_steps=16", "run.checkpoint_every=4",
                                     "run.keep_last=1", "train.rollback_on_nan=true",
                                     "train.max_bad_steps=100"};
    sets.insert(sets.end(), extra.begin(), extra.end());  // the later setting wins
    return load(sets);
  }

  // NaN gradients in the backward passes numbered `calls` (1-based): the update of such a step
  // makes the weights NaN, and the next step's loss is NaN.
  static void nan_gradients(Trainer& t, std::set<int> calls) {
    auto count = std::make_shared<int>(0);
    t.model().parameters().at(0).register_hook([count, calls](torch::Tensor grad) {
      return calls.count(++*count) ? torch::full_like(grad, NAN) : grad;
    });
  }

  static std::set<int64_t> checkpoint_steps(const config::LoadedConfig& cfg) {
    std::set<int64_t> steps;
    for (const auto& e : std::filesystem::directory_iterator(cfg.cfg.run.dir + "/checkpoints")) {
      const int64_t step = checkpoint::checkpoint_step(e.path().filename().string());
      if (step >= 0) steps.insert(step);
    }
    return steps;
  }

  // Expects t.fit() to end the run (exit 1 through the exception) saying `why`.
  static void expect_gives_up(Trainer& t, const std::string& why) {
    try {
      t.fit();
      FAIL() << "the run ended normally";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }

  static bool finite_model(const std::map<std::string, torch::Tensor>& tensors) {
    for (const auto& [name, tensor] : tensors) {
      if (name.rfind("model.", 0) == 0 && !tensor.isfinite().all().item<bool>()) return false;
    }
    return true;
  }
};

// Step 10's gradient is NaN: step 11's loss goes back to step 8's checkpoint. Step 12's gradient is
// NaN again (step 12's checkpoint is not written: its weights are NaN): step 13's loss finds that
// step 8's checkpoint led to a failure again, and the run goes back to step 4's, which keep_last 1
// would have pruned.
TEST_F(RollbackTest, ACheckpointThatLedToAFailureAgainIsPassedOverForTheOneBeforeIt) {
  Trainer clean(load({"train.max_steps=16", "run.checkpoint_every=4", "run.keep_last=10"}));
  clean.fit();
  const auto step_4 =
      checkpoint::load(clean.config().run.dir + "/checkpoints/step_00000004.safetensors");
  auto stop_cfg = run({"train.stop_at_step=13"});
  Trainer stopped(stop_cfg);
  nan_gradients(stopped, {10, 12});
  EXPECT_TRUE(stopped.fit().stopped);
  expect_same(checkpoint_tensors(stopped), {step_4.tensors.begin(), step_4.tensors.end()},
              "model.");
  // The whole run: steps 9 to 11 undone, then 5 to 8 and 12, 13; each counted once.
  auto all_cfg = run({});
  Trainer all(all_cfg);
  nan_gradients(all, {10, 12});
  EXPECT_EQ(all.fit().steps, 16);
  const auto meta = checkpoint::load(all.last_checkpoint()).meta;
  EXPECT_EQ(meta.at("rollbacks").get<int64_t>(), 2);
  EXPECT_EQ(meta.at("rolled_back_steps").get<int64_t>(), 9);
  EXPECT_EQ(meta.at("skipped_steps").get<int64_t>(), 9);
  EXPECT_TRUE(finite_model(checkpoint_tensors(all)));
  // At least train.max_rollbacks + 1 checkpoints are kept while rollbacks may need them.
  EXPECT_EQ(kept_checkpoints(all_cfg.cfg), 6);
  EXPECT_EQ(checkpoint_steps(all_cfg), (std::set<int64_t>{4, 8, 16}));
}

// A loss that stays bad: back to step 4's checkpoint, then nothing is left to go back to (the
// state of step 8 is NaN and not saved): the run ends (exit 1 through the exception), its
// checkpoints as they were.
TEST_F(RollbackTest, ALossThatStaysBadEndsTheRun) {
  std::set<int> every_call_from_6;
  for (int i = 6; i < 200; ++i) every_call_from_6.insert(i);
  auto cfg = run({});
  Trainer t(cfg);
  nan_gradients(t, every_call_from_6);
  expect_gives_up(t, "every kept checkpoint gone back to");
  EXPECT_EQ(checkpoint_steps(cfg), (std::set<int64_t>{4}));
  EXPECT_TRUE(finite_model(checkpoint_tensors(t)));
}

// The second failure after train.max_rollbacks 1 ends the run.
TEST_F(RollbackTest, MaxRollbacksLimitsThem) {
  auto cfg = run({"train.max_rollbacks=1"});
  Trainer t(cfg);
  nan_gradients(t, {10, 12});
  expect_gives_up(t, "train.max_rollbacks 1");
  EXPECT_EQ(checkpoint_steps(cfg), (std::set<int64_t>{4, 8}));
}

// train.max_bad_steps counts the steps rollbacks undid since the last checkpoint written: 3, then
// 3 + 6 = 9 >= 5 ends the run.
TEST_F(RollbackTest, StepsUndoneCountTowardsMaxBadSteps) {
  auto cfg = run({"train.max_bad_steps=5"});
  Trainer t(cfg);
  nan_gradients(t, {10, 12});
  expect_gives_up(t, "9 steps lost");
}

// Without a per-step check (train.max_bad_steps 0) a NaN loss enters the metrics window: the
// checkpoint due then is not written, and the good one before it is not pruned for it.
TEST_F(RollbackTest, AStateWhoseLossIsNanIsNotSaved) {
  auto cfg = load({"train.max_steps=8", "run.checkpoint_every=2", "run.keep_last=1",
                   "train.max_bad_steps=0", "run.log_every=100"});
  Trainer t(cfg);
  nan_gradients(t, {5});
  EXPECT_THROW(t.fit(), std::runtime_error);  // the last step's log finds the NaN loss
  EXPECT_EQ(checkpoint_steps(cfg), (std::set<int64_t>{4}));
  EXPECT_TRUE(finite_model(checkpoint_tensors(t)));
}

}  // namespace
}  // namespace trainer::engine
