// Learning-rate schedules against their closed forms at chosen steps.
#include <gtest/gtest.h>

#include "optim/schedule.h"

namespace trainer::optim {
namespace {

config::SchedConfig sched(const std::string& name) {
  config::SchedConfig cfg;
  cfg.name = name;
  return cfg;
}

TEST(Schedule, ConstantIsTheBaseRate) {
  Schedule s(sched("constant"), /*base_lr=*/0.1, /*total_steps=*/100);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(99), 0.1);
}

TEST(Schedule, LinearWarmupFromStartFactor) {
  auto cfg = sched("constant");
  cfg.warmup_steps = 4;
  cfg.warmup_start_factor = 0.5;
  Schedule s(cfg, /*base_lr=*/0.1, /*total_steps=*/100);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.0625);  // 0.1 * (0.5 + 0.5 * 1/4)
  EXPECT_DOUBLE_EQ(s.lr(1), 0.075);   // 0.1 * (0.5 + 0.5 * 2/4)
  EXPECT_DOUBLE_EQ(s.lr(3), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(4), 0.1);
}

TEST(Schedule, WarmupFromZero) {
  auto cfg = sched("constant");
  cfg.warmup_steps = 10;
  Schedule s(cfg, /*base_lr=*/0.1, /*total_steps=*/100);
  EXPECT_NEAR(s.lr(0), 0.01, 1e-15);
  EXPECT_NEAR(s.lr(4), 0.05, 1e-15);
}

TEST(Schedule, StepDecaysEveryStepSize) {
  auto cfg = sched("step");
  cfg.step_size = 30;
  cfg.gamma = 0.1;
  Schedule s(cfg, /*base_lr=*/0.1, /*total_steps=*/100);
  EXPECT_NEAR(s.lr(29), 0.1, 1e-15);
  EXPECT_NEAR(s.lr(30), 0.01, 1e-15);
  EXPECT_NEAR(s.lr(59), 0.01, 1e-15);
  EXPECT_NEAR(s.lr(60), 0.001, 1e-15);
}

TEST(Schedule, StepCountsFromTheEndOfWarmup) {
  auto cfg = sched("step");
  cfg.step_size = 30;
  cfg.gamma = 0.5;
  cfg.warmup_steps = 5;
  Schedule s(cfg, /*base_lr=*/0.2, /*total_steps=*/100);
  EXPECT_NEAR(s.lr(34), 0.2, 1e-15);
  EXPECT_NEAR(s.lr(35), 0.1, 1e-15);
}

TEST(Schedule, MultistepDecaysAtMilestones) {
  auto cfg = sched("multistep");
  cfg.milestones = {10, 25};
  cfg.gamma = 0.5;
  Schedule s(cfg, /*base_lr=*/0.1, /*total_steps=*/100);
  EXPECT_NEAR(s.lr(9), 0.1, 1e-15);
  EXPECT_NEAR(s.lr(10), 0.05, 1e-15);
  EXPECT_NEAR(s.lr(24), 0.05, 1e-15);
  EXPECT_NEAR(s.lr(25), 0.025, 1e-15);
  EXPECT_NEAR(s.lr(99), 0.025, 1e-15);
}

TEST(Schedule, CosineAfterWarmup) {
  auto cfg = sched("cosine");
  cfg.warmup_steps = 10;
  Schedule s(cfg, /*base_lr=*/0.1, /*total_steps=*/110);  // 100 decay steps
  EXPECT_NEAR(s.lr(10), 0.1, 1e-15);
  EXPECT_NEAR(s.lr(35), 0.085355339059327376, 1e-12);  // 0.05 * (1 + cos(pi/4))
  EXPECT_NEAR(s.lr(60), 0.05, 1e-12);
  EXPECT_NEAR(s.lr(85), 0.014644660940672624, 1e-12);  // 0.05 * (1 - cos(pi/4))
  EXPECT_NEAR(s.lr(110), 0.0, 1e-12);
}

TEST(Schedule, CosineEndsAtMinLr) {
  auto cfg = sched("cosine");
  cfg.min_lr = 0.01;
  Schedule s(cfg, /*base_lr=*/0.1, /*total_steps=*/100);
  EXPECT_NEAR(s.lr(50), 0.055, 1e-12);
  EXPECT_NEAR(s.lr(100), 0.01, 1e-12);
  EXPECT_NEAR(s.lr(500), 0.01, 1e-12);
}

TEST(Schedule, LinearDecay) {
  auto cfg = sched("linear");
  cfg.min_lr = 0.01;
  Schedule s(cfg, /*base_lr=*/0.1, /*total_steps=*/100);
  EXPECT_NEAR(s.lr(0), 0.1, 1e-15);
  EXPECT_NEAR(s.lr(50), 0.055, 1e-12);
  EXPECT_NEAR(s.lr(75), 0.0325, 1e-12);
  EXPECT_NEAR(s.lr(100), 0.01, 1e-12);
}

TEST(Schedule, UnknownNameListsTheRegisteredOnes) {
  try {
    Schedule s(sched("exponential"), /*base_lr=*/0.1, /*total_steps=*/10);
    FAIL() << "expected UnknownName";
  } catch (const UnknownName& e) {
    EXPECT_STREQ(e.what(),
                 "unknown scheduler 'exponential'; registered: constant, cosine, linear, "
                 "multistep, step");
  }
}

}  // namespace
}  // namespace trainer::optim
