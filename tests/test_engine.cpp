// The training engine: accumulation, clipping, evaluation, config errors found while building.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "config/loader.h"
#include "engine/memory.h"
#include "engine/trainer.h"
#include "models/model.h"
#include "temp_dir.h"

namespace trainer::engine {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  // A validated config for a small synthetic-data run, with `overrides` applied.
  config::LoadedConfig load(const std::vector<std::string>& overrides) {
    const auto path = tmp_ / ("run" + std::to_string(++runs_) + ".yaml");
    std::ofstream(path) << "seed: 5\ndeterministic: true\ndevice: cpu\n"
                           "model: {name: mlp, hidden: [16]}\n"
                           "data: {name: synthetic, shape: [12], num_classes: 3, "
                           "train_samples: 128, val_samples: 64, batch_size: 32, workers: 0}\n"
                           "train: {max_steps: 4}\noptim: {lr: 0.1, momentum: 0.0}\n"
                           "run: {log_every: 1, progress: never, dir: "
                        << (tmp_ / ("out" + std::to_string(runs_))).string() << "}\n";
    auto loaded = config::load(path.string(), overrides);
    config::check(loaded, config::Environment{});
    std::filesystem::create_directories(loaded.cfg.run.dir);
    return loaded;
  }

  test_support::TempDir tmp_{"engine"};
  int runs_ = 0;
};

TEST_F(EngineTest, AccumulatingTwoHalfBatchesEqualsOneFullBatch) {
  auto full_cfg = load({"data.batch_size=32", "train.grad_accum_steps=1"});
  auto half_cfg = load({"data.batch_size=16", "train.grad_accum_steps=2"});
  Trainer full(full_cfg), half(half_cfg);
  const auto a = full.fit(), b = half.fit();
  EXPECT_EQ(a.steps, 4);
  EXPECT_EQ(b.steps, 4);
  EXPECT_NEAR(a.last_eval.loss, b.last_eval.loss, 1e-5);
}

TEST_F(EngineTest, ClippingBoundsTheUpdate) {
  auto free_cfg = load({});
  auto clipped_cfg = load({"train.clip_grad_norm=1e-6"});
  Trainer free(free_cfg), clipped(clipped_cfg), untrained(load({}));
  const double start = untrained.evaluate().loss;
  const double free_loss = free.fit().last_eval.loss;
  const double clipped_loss = clipped.fit().last_eval.loss;
  EXPECT_LT(free_loss, start - 0.05);
  // 4 steps of at most lr * 1e-6 in norm barely move the weights.
  EXPECT_NEAR(clipped_loss, start, 1e-4);
}

TEST_F(EngineTest, EvaluationCountsEverySample) {
  auto cfg = load({"data.eval_batch_size=50"});  // 64 = 50 + 14
  Trainer t(cfg);
  const auto e = t.evaluate();
  EXPECT_EQ(e.samples, 64);
  EXPECT_GE(e.top5, e.top1);
  EXPECT_DOUBLE_EQ(e.top5, 1.0);  // 3 classes: the target is always among the top 5
}

TEST_F(EngineTest, MaxStepsAcrossEpochs) {
  auto cfg = load({"train.max_steps=10"});  // 4 steps per epoch
  Trainer t(cfg);
  EXPECT_EQ(t.fit().steps, 10);
}

TEST_F(EngineTest, StopFlagEndsAfterTheCurrentStep) {
  auto cfg = load({"train.max_steps=100"});
  Trainer t(cfg);
  std::atomic<bool> stop{true};
  const auto r = t.fit(&stop);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.steps, 1);
}

TEST_F(EngineTest, BatchLargerThanTheDataIsAConfigError) {
  auto cfg = load({"data.batch_size=100", "train.grad_accum_steps=2"});
  try {
    Trainer t(cfg);
    FAIL() << "expected ConfigError";
  } catch (const config::ConfigError& e) {
    ASSERT_EQ(e.issues().size(), 1u);
    EXPECT_EQ(e.issues()[0].key, "data.batch_size");
    EXPECT_NE(e.issues()[0].where.file.find("--set data.batch_size=100"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("128 training samples"), std::string::npos) << e.what();
  }
}

TEST_F(EngineTest, LenetOnFlatSamplesIsAConfigError) {
  auto cfg = load({"model.name=lenet"});
  try {
    Trainer t(cfg);
    FAIL() << "expected ConfigError";
  } catch (const config::ConfigError& e) {
    EXPECT_EQ(e.issues().at(0).key, "data.shape");
  }
}

TEST(MemoryTest, CountsWhatTheCpuAllocatorHandsOut) {
  const int64_t peak = measure_cpu_peak([] {
    auto a = torch::empty({1 << 18});  // 1 MiB
    auto b = torch::empty({1 << 17});  // 0.5 MiB, both alive at once
  });
  EXPECT_GE(peak, (1 << 20) + (1 << 19));
  EXPECT_LT(peak, 2 << 20);
  EXPECT_EQ(measure_cpu_peak([] {}), 0);
}

TEST_F(EngineTest, MemoryEstimateMatchesAMeasuredStep) {
  // ResNet-18 at 48 px: the estimate from batches 2 and 4, checked against batch 8 measured.
  auto cfg = load({"model.name=resnet18", "model.num_classes=0", "data.shape=[3,48,48]",
                   "data.num_classes=10", "optim.momentum=0.9"});
  Trainer t(cfg);
  const auto fp32 = t.estimate_memory(/*bf16=*/false);
  const auto bf16 = t.estimate_memory(/*bf16=*/true);
  EXPECT_GT(fp32.params_bytes, 40'000'000);            // 11.2M float parameters
  EXPECT_EQ(fp32.optimizer_bytes, fp32.params_bytes);  // one momentum buffer each
  EXPECT_GT(fp32.step_bytes_per_sample, 0);
  EXPECT_LT(bf16.step_bytes_per_sample, fp32.step_bytes_per_sample);

  auto model =
      models::model_registry().get("resnet18")(cfg.cfg.model, models::InputSpec{{3, 48, 48}, 10});
  model->train();
  const auto x = torch::randn({8, 3, 48, 48});
  const auto y = torch::randint(10, {8}, torch::kInt64);
  const int64_t measured = measure_cpu_peak([&] {
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
  });
  const int64_t estimated = fp32.step_fixed_bytes + 8 * fp32.step_bytes_per_sample;
  EXPECT_NEAR(static_cast<double>(estimated), static_cast<double>(measured), 0.25 * measured)
      << "estimated " << estimated << ", measured " << measured;
}

}  // namespace
}  // namespace trainer::engine
