// `trainer bench`: its figures agree with one another and with the model's FLOPs, its usage
// errors, and that it leaves no run dir behind.
#include <cmath>

#include "cli_fixture.h"

namespace {

using trainer::test_support::Cli;
using trainer::test_support::read_file;
namespace fs = std::filesystem;

// A 2-layer MLP on 1x4x5 synthetic samples: forward FLOPs 2 * B * (20*24 + 24*12 + 12*3).
constexpr const char* kMlp =
    "seed: 1\ndevice: cpu\nmodel: {name: mlp, hidden: [24, 12]}\n"
    "data: {name: synthetic, shape: [1, 4, 5], num_classes: 3, train_samples: 64, "
    "val_samples: 8, batch_size: 16, workers: 1}\noptim: {name: sgd, lr: 0.05}\n"
    "run: {dir: bench_run_dir_must_not_appear, threads: 1}\n";

class Bench : public Cli {
 protected:
  nlohmann::json bench(const std::string& config, const std::string& flags) {
    const auto path = write("c.yaml", config);
    const auto json = dir_ / "out.json";
    const auto r =
        run("bench --config '" + path.string() + "' --json '" + json.string() + "' " + flags);
    EXPECT_EQ(r.code, 0) << r.err;
    last_out_ = r.out;
    return nlohmann::json::parse(read_file(json));
  }
  std::string last_out_;
};

TEST_F(Bench, FiguresAgreeWithOneAnother) {
  const auto j = bench(kMlp, "--steps 12 --warmup 2");
  EXPECT_EQ(j["impl"], "trainer");
  EXPECT_EQ(j["model"], "mlp");
  EXPECT_EQ(j["steps"], 12);
  EXPECT_EQ(j["warmup"], 2);
  EXPECT_EQ(j["world_size"], 1);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_EQ(j["precision"], "float32");
  const auto& t = j["step_time_ms"];
  EXPECT_GT(t["p50"].get<double>(), 0.0);
  EXPECT_LE(t["p50"].get<double>(), t["p90"].get<double>());
  EXPECT_LE(t["p90"].get<double>(), t["max"].get<double>());
  // The phases tile each step.
  double phases = 0.0;
  for (const char* p : {"data", "forward", "backward", "grad_sync", "optimizer"}) {
    ASSERT_TRUE(j["phases_ms"].contains(p)) << p;
    EXPECT_GE(j["phases_ms"][p].get<double>(), 0.0) << p;
    phases += j["phases_ms"][p].get<double>();
  }
  EXPECT_NEAR(phases, t["mean"].get<double>(), 1e-6 * t["mean"].get<double>());
  EXPECT_GT(j["phases_ms"]["backward"].get<double>(), 0.0);
  // Throughput: the timed samples over the wall time of the timed steps.
  EXPECT_NEAR(j["samples_per_sec"].get<double>(), 12 * 16 / j["seconds"].get<double>(), 1e-6);
  EXPECT_LE(t["mean"].get<double>() * 12 / 1e3, j["seconds"].get<double>() * 1.0001);
  EXPECT_EQ(j["flops_per_step"], 3 * 2 * 16 * (20 * 24 + 24 * 12 + 12 * 3));
  EXPECT_GT(j["peak_tflops"].get<double>(), 0.0);
  EXPECT_NEAR(j["mfu"].get<double>(), j["tflops"].get<double>() / j["peak_tflops"].get<double>(),
              1e-9);
  EXPECT_EQ(j["peak_memory_kind"], "cpu_rss");
  EXPECT_GT(j["peak_memory_mb"].get<double>(), 10.0);
  EXPECT_TRUE(std::isfinite(j["final_loss"].get<double>()));
  EXPECT_TRUE(j["tokens_per_sec"].is_null());
  EXPECT_NE(last_out_.find("samples/s"), std::string::npos) << last_out_;
  EXPECT_NE(last_out_.find("p90"), std::string::npos) << last_out_;
  EXPECT_FALSE(fs::exists(fs::path(TRAINER_SOURCE_DIR) / "bench_run_dir_must_not_appear"));
}

TEST_F(Bench, LanguageModelsReportTokens) {
  const auto j = bench(
      "device: cpu\nmodel: {name: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 8, "
      "vocab_size: 0, dropout: 0.0}\ndata: {name: synthetic_tokens, num_classes: 50, "
      "train_samples: 32, batch_size: 4, workers: 0}\noptim: {name: adamw, lr: 0.001}\n",
      "--steps 3 --warmup 1");
  EXPECT_NEAR(j["tokens_per_sec"].get<double>(), 8 * j["samples_per_sec"].get<double>(), 1e-6);
  // Attention counts 4 * B * H * T * T * (C / H) per layer besides the products of the linears.
  const int64_t b = 4, t = 8, c = 16, v = 50;
  const int64_t linears = 2 * b * t * (c * 3 * c + c * c + c * 4 * c + 4 * c * c + c * v);
  EXPECT_EQ(j["flops_per_step"], 3 * (linears + 4 * b * t * t * c));
}

TEST_F(Bench, AFixedBatchIsReported) {
  const auto j = bench(kMlp, "--steps 3 --warmup 1 --fixed-batch");
  EXPECT_EQ(j["fixed_batch"], true);
  EXPECT_NE(last_out_.find("one fixed batch"), std::string::npos) << last_out_;
}

// --count-steps: the operators of that many steps after the timed ones (3 by default); 0 counts
// none, so that a memory measurement runs the timed steps alone.
TEST_F(Bench, CountStepsChoosesTheStepsWhoseOperatorsAreCounted) {
  auto j = bench(kMlp, "--steps 2 --warmup 1");
  EXPECT_GT(j["ops_per_step"]["total"].get<double>(), 0.0) << j["ops_per_step"];
  j = bench(kMlp, "--steps 2 --warmup 1 --count-steps 0");
  EXPECT_TRUE(j["ops_per_step"].empty()) << j["ops_per_step"];
  EXPECT_EQ(j["host_syncs_per_step"].get<double>(), 0.0);
  EXPECT_EQ(last_out_.find("ATen operators per step"), std::string::npos) << last_out_;
}

TEST_F(Bench, UsageErrorsExitTwoWithOneLine) {
  const auto path = write("c.yaml", kMlp);
  auto r = run("bench --config '" + path.string() + "' --steps 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--steps must be at least 1, got 0"), std::string::npos) << r.err;
  r = run("bench --config '" + path.string() + "' --count-steps -1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--count-steps must not be negative, got -1"), std::string::npos) << r.err;
  r = run("bench --steps 5");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--config FILE is required"), std::string::npos) << r.err;
  r = run("bench --config '" + path.string() + "' --set optim.lr=-1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("optim.lr"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("frame #"), std::string::npos) << r.err;
}

// bench --kernels times CUDA kernels: on the CPU one line naming what it needs, exit 1; a
// device that is not one, exit 2 (the GPU side: GpuKernels.BenchKernelsTimesEveryKernel).
TEST_F(Bench, KernelsNeedACudaDevice) {
  auto r = run("bench --kernels --device cpu");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("run on a CUDA device; cpu given"), std::string::npos) << r.err;
  r = run("bench --kernels --device gpu7");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("'gpu7' is not a device"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("frame #"), std::string::npos) << r.err;
}

}  // namespace
