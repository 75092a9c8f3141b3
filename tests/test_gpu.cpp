// Training on a CUDA device; every test skips when no GPU is visible.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "config/loader.h"
#include "engine/trainer.h"
#include "temp_dir.h"
#include "util/gpu_monitor.h"

namespace trainer::engine {
namespace {

namespace fs = std::filesystem;

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible"

config::LoadedConfig synthetic_run(const fs::path& dir, const std::string& device) {
  fs::create_directories(dir);
  const fs::path cfg = dir / "run.yaml";
  std::ofstream(cfg) << "seed: 3\ndeterministic: true\ndevice: " << device
                     << "\nmodel: {name: lenet, channels: [8, 16], fc_hidden: 32}\n"
                        "data: {name: synthetic, shape: [1, 12, 12], train_samples: 256, "
                        "val_samples: 64, batch_size: 32, workers: 1}\n"
                        "train: {max_steps: 16}\noptim: {lr: 0.05}\nrun: {log_every: 4, dir: "
                     << (dir / "run").string() << "}\n";
  auto loaded = config::load(cfg.string(), {});
  config::Environment env;
  env.cuda_available = torch::cuda::is_available();
  env.cuda_devices = static_cast<int64_t>(torch::cuda::device_count());
  config::check(loaded, env);
  fs::create_directories(loaded.cfg.run.dir);
  return loaded;
}

TEST(Gpu, TrainsOnCudaAndMatchesCpuClosely) {
  SKIP_WITHOUT_CUDA();
  test_support::TempDir cuda_dir("gpu"), cpu_dir("gpu");
  auto cuda_cfg = synthetic_run(cuda_dir.path(), "cuda");
  auto cpu_cfg = synthetic_run(cpu_dir.path(), "cpu");
  Trainer on_cuda(cuda_cfg), on_cpu(cpu_cfg);
  const auto gpu = on_cuda.fit();
  const auto cpu = on_cpu.fit();
  EXPECT_EQ(gpu.steps, 16);
  EXPECT_GT(gpu.last_eval.top1, 0.9);
  // Same seed, same data order: the two devices agree up to floating-point differences.
  EXPECT_NEAR(gpu.last_eval.loss, cpu.last_eval.loss, 1e-2);
}

TEST(Gpu, DeterministicCudaRunsRepeat) {
  SKIP_WITHOUT_CUDA();
  test_support::TempDir a_dir("gpu"), b_dir("gpu");
  auto a_cfg = synthetic_run(a_dir.path(), "cuda:0");
  auto b_cfg = synthetic_run(b_dir.path(), "cuda:0");
  Trainer a(a_cfg), b(b_cfg);
  EXPECT_EQ(a.fit().last_eval.loss, b.fit().last_eval.loss);
}

TEST(GpuMonitorTest, ReadsTheTrainingDevice) {
  SKIP_WITHOUT_CUDA();
  std::string why;
  auto monitor = GpuMonitor::open(/*index=*/0, &why);
  ASSERT_NE(monitor, nullptr) << why;
  const auto sample = monitor->sample();
  ASSERT_TRUE(sample.has_value());
  EXPECT_GT(sample->mem_total_mb, 1000.0);
  EXPECT_GE(sample->util_pct, 0.0);
  EXPECT_LE(sample->util_pct, 100.0);
}

TEST(GpuMonitorTest, TrainRecordsCarryGpuReadings) {
  SKIP_WITHOUT_CUDA();
  test_support::TempDir tmp("gpu_metrics");
  auto loaded = synthetic_run(tmp.path(), "cuda");
  Trainer t(loaded);
  t.fit();
  std::ifstream in(tmp.path() / "run" / "metrics.jsonl");
  std::string first;
  std::getline(in, first);
  EXPECT_NE(first.find("\"gpu_mem_mb\""), std::string::npos) << first;
  EXPECT_NE(first.find("\"gpu_util\""), std::string::npos) << first;
}

}  // namespace
}  // namespace trainer::engine
