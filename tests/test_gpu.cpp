// Training on a CUDA device; every test skips when no GPU is visible.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli_fixture.h"
#include "config/loader.h"
#include "engine/loop/trainer.h"
#include "engine/measure/memory.h"
#include "engine/setup/components.h"
#include "losses/loss.h"
#include "models/model.h"
#include "nn/activation_checkpoint.h"
#include "nn/autocast.h"
#include "optim/grad_scaler.h"
#include "temp_dir.h"
#include "util/gpu_monitor.h"
#include "util/net/net.h"

namespace trainer::engine {
namespace {

namespace fs = std::filesystem;

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible"

config::LoadedConfig synthetic_run(const fs::path& dir, const std::string& device,
                                   const std::vector<std::string>& overrides = {}) {
  fs::create_directories(dir);
  const fs::path cfg = dir / "run.yaml";
  std::ofstream(cfg) << "seed: 3\ndeterministic: true\ndevice: " << device
                     << "\nmodel: {name: lenet, channels: [8, 16], fc_hidden: 32}\n"
                        "data: {name: synthetic, shape: [1, 12, 12], train_samples: 256, "
                        "val_samples: 64, batch_size: 32, workers: 1}\n"
                        "train: {max_steps: 16}\noptim: {lr: 0.05}\nrun: {log_every: 4, dir: "
                     << (dir / "run").string() << "}\n";
  auto loaded = engine::load_config(cfg.string(), overrides);
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
  // Learnt something: below the loss of a uniform guess over the 10 classes.
  EXPECT_LT(gpu.last_eval.loss, std::log(10.0) - 0.1);
  // Same seed, same data order: the two devices agree up to floating-point differences, in the
  // loss and (within one of the 64 validation samples) in top-1.
  EXPECT_NEAR(gpu.last_eval.loss, cpu.last_eval.loss, 1e-2);
  EXPECT_NEAR(gpu.last_eval.top1, cpu.last_eval.top1, 1.0 / 64 + 1e-9);
}

// The fused cross-entropy kernel against ATen's log_softmax + nll_loss in float64 on the same
// logits: loss and gradient, float32 / bfloat16 / float16 logits, with and without label smoothing,
// at GPT-2's vocabulary and ResNet's 1000 classes. Without gradients the logits stay as they were;
// with them the step's peak memory stays within the logits and their gradient.
TEST(GpuLoss, FusedCrossEntropyMatchesATen) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  const torch::Device cuda(torch::kCUDA, 0);
  for (const int64_t k : {int64_t{1000}, int64_t{50257}}) {
    for (const double smoothing : {0.0, 0.1}) {
      config::TrainConfig cfg;
      cfg.label_smoothing = smoothing;
      auto loss = losses::loss_registry().get("cross_entropy")(cfg);
      for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
        SCOPED_TRACE(testing::Message() << "K " << k << " smoothing " << smoothing << " " << dtype);
        const int64_t n = 64;
        const auto base = (torch::randn({n, k}, cuda) * 3).to(dtype);
        const auto targets = torch::randint(k, {n}, torch::TensorOptions(cuda).dtype(torch::kLong));
        auto ref_in = base.to(torch::kDouble).requires_grad_(true);
        auto ref = torch::nn::functional::cross_entropy(
            ref_in, targets,
            torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(smoothing));
        ref.backward();
        auto leaf = base.clone().requires_grad_(true);
        auto logits = leaf * 1.0;  // a model's output: the loss may write over it
        auto ours = loss(logits, targets);
        ours.backward();
        EXPECT_NEAR(ours.item<double>(), ref.item<double>(), 2e-5 * ref.item<double>());
        const double grad_tol = dtype == torch::kFloat ? 1e-6 : 3e-3 / static_cast<double>(n);
        EXPECT_LE((leaf.grad().to(torch::kDouble) - ref_in.grad()).abs().max().item<double>(),
                  grad_tol);
        torch::NoGradGuard no_grad;
        const auto kept = base.clone();
        const auto eval_loss = loss(kept, targets);
        EXPECT_TRUE(torch::equal(kept, base));
        EXPECT_NEAR(eval_loss.item<double>(), ours.item<double>(), 1e-6 * ours.item<double>());
      }
    }
  }
  // GPT-2's logits of 8 x 1024 tokens in bfloat16: the forward and backward hold the logits and
  // their gradient, where ATen's path holds float32 log-probabilities and gradients besides.
  config::TrainConfig cfg;
  auto loss = losses::loss_registry().get("cross_entropy")(cfg);
  const int64_t n = 8192, k = 50257;
  const auto bytes = static_cast<double>(n * k * 2);
  auto peak = [&](bool fused) {
    auto leaf = torch::randn({n, k}, torch::TensorOptions(cuda).dtype(torch::kBFloat16))
                    .requires_grad_(true);
    const auto targets = torch::randint(k, {n}, torch::TensorOptions(cuda).dtype(torch::kLong));
    torch::cuda::synchronize();
    engine::reset_cuda_peak(0);
    const auto before = engine::cuda_memory(0).peak;  // what is held now
    auto logits = leaf * 1.0;
    auto l = fused ? loss(logits, targets)
                   : torch::nn::functional::cross_entropy(logits.to(torch::kFloat), targets);
    l.backward();
    torch::cuda::synchronize();
    return static_cast<double>(engine::cuda_memory(0).peak - before);
  };
  const double fused = peak(true), reference = peak(false);
  std::cout << "cross-entropy peak, 8192 x 50257 bfloat16: fused " << fused / bytes
            << " x the logits, ATen " << reference / bytes << " x\n";
  EXPECT_LE(fused, 2.1 * bytes);
  EXPECT_LT(fused, 0.5 * reference);
}

// train.cuda_graph through the command line, with the loader's threads, logging, evaluation,
// checkpoints and a resume: exit 0, and in deterministic mode the loss curve of the eager run
// step for step (within float32 rounding of the learning rate, which the graph reads from a
// tensor); the resumed run ends as the uninterrupted one.
using GpuGraphCli = test_support::Cli;

TEST_F(GpuGraphCli, TrainsThroughTheCommandLineAsEagerSteps) {
  SKIP_WITHOUT_CUDA();
  const fs::path cfg = write("graph.yaml",
                             "device: cuda\nseed: 5\ndeterministic: true\n"
                             "model: {name: resnet18, stem: cifar}\n"
                             "data: {name: synthetic, shape: [3, 32, 32], train_samples: 512, "
                             "val_samples: 64, batch_size: 32, workers: 2}\n"
                             "optim: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                             "amp: {enabled: true, dtype: bfloat16}\n"
                             "train: {max_steps: 40}\n"
                             "run: {log_every: 1, eval_every: 16, checkpoint_every: 10, "
                             "progress: never}\n");
  const auto train = [&](const std::string& name, const std::string& extra) {
    const auto r =
        run("--config '" + cfg.string() + "' --run-dir '" + (dir_ / name).string() + "' " + extra);
    EXPECT_EQ(r.code, 0) << r.err;
    return losses(dir_ / name);
  };
  const auto eager = train("eager", "");
  const auto graph = train("graph", "--set train.cuda_graph=true");
  ASSERT_EQ(eager.size(), 40u);
  ASSERT_EQ(graph.size(), eager.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_NEAR(graph[i], eager[i], 1e-4 * std::abs(eager[i])) << "step " << i + 1;
  }
  EXPECT_TRUE(fs::exists(dir_ / "graph" / "checkpoints" / "step_00000040.safetensors"));
  // Stopped at step 20 and resumed: the same curve as the uninterrupted graphed run.
  train("parts", "--set train.cuda_graph=true --set train.stop_at_step=20");
  const auto resumed = train("parts", "--set train.cuda_graph=true --resume auto");
  ASSERT_EQ(resumed.size(), graph.size());
  for (size_t i = 0; i < graph.size(); ++i) {
    EXPECT_NEAR(resumed[i], graph[i], 1e-4 * std::abs(graph[i])) << "step " << i + 1;
  }
}

// Decoding on CUDA under bfloat16 autocast (trainer generate's path): the cached decoder's
// logits follow the forward pass's within bfloat16 rounding, and greedy tokens are the CPU's.
TEST(GpuDecode, CachedDecodingOnCudaUnderAutocast) {
  SKIP_WITHOUT_CUDA();
  test_support::TempDir dir("gpu");
  const std::vector<std::string> gpt = {"model.name=gpt",      "model.n_layer=2",
                                        "model.n_head=2",      "model.n_embd=32",
                                        "model.block_size=32", "model.vocab_size=64",
                                        "model.dropout=0",     "data.name=synthetic_tokens",
                                        "data.num_classes=64", "amp.enabled=true",
                                        "amp.dtype=bfloat16"};
  Trainer on_cuda(synthetic_run(dir.path() / "cuda", "cuda", gpt));
  auto decoder = on_cuda.decoder(/*use_cache=*/true);
  ASSERT_TRUE(decoder);
  const auto tokens = torch::randint(64, {1, 12}, torch::kLong).to(on_cuda.device());
  torch::Tensor full;
  {
    torch::NoGradGuard no_grad;
    nn::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16, true);
    full = on_cuda.model().as<models::NetImpl>()->forward(tokens).to(torch::kFloat);
  }
  auto logits = decoder->next_logits(tokens.slice(1, 0, 4));
  EXPECT_LT((logits - full.select(1, 3)).abs().max().item<double>(), 0.1);
  for (int64_t t = 4; t < 12; ++t) {
    logits = decoder->next_logits(tokens.slice(1, t, t + 1));
    EXPECT_LT((logits - full.select(1, t)).abs().max().item<double>(), 0.1) << t;
  }
}

// A run with train.cuda_graph (3 eager steps, then replays of the captured step) trains as the
// eager run: its losses within float32 rounding of the learning rate, the same skipped steps.
TEST(GpuGraph, ReplayedStepsTrainAsEagerOnes) {
  SKIP_WITHOUT_CUDA();
  test_support::TempDir eager_dir("gpu"), graph_dir("gpu");
  const std::vector<std::string> sets = {"optim.name=adamw", "optim.lr=0.01",
                                         "train.clip_grad_norm=1"};
  auto graph_sets = sets;
  graph_sets.push_back("train.cuda_graph=true");
  auto eager_cfg = synthetic_run(eager_dir.path(), "cuda", sets);
  auto graph_cfg = synthetic_run(graph_dir.path(), "cuda", graph_sets);
  Trainer eager(eager_cfg), graphed(graph_cfg);
  const auto a = eager.fit(), b = graphed.fit();
  EXPECT_EQ(b.steps, 16);
  EXPECT_NEAR(a.last_eval.loss, b.last_eval.loss, 1e-3 * std::abs(a.last_eval.loss));
}

TEST(Gpu, DeterministicCudaRunsRepeat) {
  SKIP_WITHOUT_CUDA();
  test_support::TempDir a_dir("gpu"), b_dir("gpu");
  auto a_cfg = synthetic_run(a_dir.path(), "cuda:0");
  auto b_cfg = synthetic_run(b_dir.path(), "cuda:0");
  Trainer a(a_cfg), b(b_cfg);
  EXPECT_EQ(a.fit().last_eval.loss, b.fit().last_eval.loss);
}

// A one-rank NCCL group on cuda:0 (what `trainer launch --nproc-per-node 1` forms on a GPU): DDP
// through c10d's Reducer trains to the same weights as a plain run.
TEST(GpuDist, NcclGroupOfOneTrainsAsAPlainRun) {
  SKIP_WITHOUT_CUDA();
  test_support::TempDir plain_dir("gpu");
  Trainer plain(synthetic_run(plain_dir.path(), "cuda"));
  const auto a = plain.fit();
  // Alone without the reducer (the default), and with it (NCCL's path of a larger group).
  for (const bool reducer : {false, true}) {
    SCOPED_TRACE(reducer ? "with the reducer" : "without the reducer");
    test_support::TempDir ddp_dir("gpu");
    auto ddp_cfg = synthetic_run(
        ddp_dir.path(), "cuda",
        {std::string("dist.reducer_at_world_size_1=") + (reducer ? "true" : "false")});
    distributed::DistEnv job;
    job.source = "torchrun";
    job.master_port = free_port();
    Trainer ddp(ddp_cfg, job);
    EXPECT_NE(ddp.summary().find("nccl"), std::string::npos) << ddp.summary();
    const auto b = ddp.fit();
    EXPECT_EQ(b.steps, 16);
    EXPECT_NEAR(a.last_eval.loss, b.last_eval.loss, 1e-4);
    auto pa = plain.model().parameters(), pb = ddp.model().parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(torch::allclose(pa[i], pb[i], 1e-5, 1e-6)) << i;
    }
  }
}

// dist.strategy fsdp on CUDA: alone, and in an NCCL group of one (all-gathers and reduce-scatters
// through NCCL, gathered buffers allocated and freed by the caching allocator), trains as a plain
// run; bfloat16 gathers under autocast stay close to autocast over float32 weights.
TEST(GpuFsdp, ShardedTrainingOnCudaTrainsAsAPlainRun) {
  SKIP_WITHOUT_CUDA();
  test_support::TempDir plain_dir("gpu");
  Trainer plain(synthetic_run(plain_dir.path(), "cuda"));
  const auto a = plain.fit();
  for (const bool group : {false, true}) {
    SCOPED_TRACE(group ? "NCCL group of one" : "alone");
    test_support::TempDir dir("gpu");
    distributed::DistEnv job;
    if (group) {
      job.source = "torchrun";
      job.master_port = free_port();
    }
    Trainer fsdp(synthetic_run(dir.path(), "cuda", {"dist.strategy=fsdp"}), job);
    const auto b = fsdp.fit();
    EXPECT_EQ(b.steps, 16);
    EXPECT_NEAR(a.last_eval.loss, b.last_eval.loss, 1e-4);
  }
  test_support::TempDir amp_plain_dir("gpu"), amp_fsdp_dir("gpu");
  const std::vector<std::string> amp = {"amp.enabled=true", "amp.dtype=bfloat16"};
  auto fsdp_amp = amp;
  fsdp_amp.push_back("dist.strategy=fsdp");
  Trainer amp_plain(synthetic_run(amp_plain_dir.path(), "cuda", amp));
  Trainer amp_fsdp(synthetic_run(amp_fsdp_dir.path(), "cuda", fsdp_amp));
  EXPECT_NEAR(amp_plain.fit().last_eval.loss, amp_fsdp.fit().last_eval.loss, 2e-2);
}

TEST(GpuAmp, Float16AutocastAndTheScalerOnCuda) {
  SKIP_WITHOUT_CUDA();
  torch::nn::Linear lin(16, 4);
  lin->to(torch::kCUDA);
  const auto x = torch::randn({8, 16}, torch::kCUDA);
  const auto y =
      torch::randint(4, {8}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kLong));
  torch::Tensor logits, loss;
  {
    nn::AutocastGuard autocast(torch::kCUDA, torch::kHalf);
    logits = lin->forward(x);
    loss = torch::nn::functional::cross_entropy(logits, y);
  }
  EXPECT_EQ(logits.scalar_type(), torch::kHalf);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  optim::GradScaler scaler(optim::GradScalerOptions{}, torch::kCUDA);
  scaler.scale(loss).backward();
  const auto params = lin->parameters();
  EXPECT_EQ(scaler.unscale(params).item<float>(), 0.0f);
  params[0].mutable_grad()[0][0] = INFINITY;
  EXPECT_EQ(scaler.unscale(params).item<float>(), 1.0f);
  scaler.update(torch::ones({}, torch::kCUDA));
  EXPECT_EQ(scaler.scale_value(), 32768.0);
}

TEST(GpuAmp, CheckpointReplaysCudaDropout) {
  SKIP_WITHOUT_CUDA();
  torch::nn::Linear lin(32, 32);
  lin->to(torch::kCUDA);
  auto fn = [lin](const torch::Tensor& in) mutable {
    return torch::dropout(torch::relu(lin->forward(in)), /*p=*/0.3, /*train=*/true);
  };
  auto run = [&](bool checkpointed) {
    torch::manual_seed(9);
    lin->zero_grad();
    auto x =
        torch::randn({16, 32}, torch::TensorOptions().device(torch::kCUDA).requires_grad(true));
    auto out = checkpointed ? nn::checkpoint(*lin, fn, x) : fn(x);
    out.pow(2).sum().backward();
    return std::vector<torch::Tensor>{x.grad().cpu(), lin->weight.grad().cpu(),
                                      torch::rand({4}, torch::kCUDA).cpu()};
  };
  const auto a = run(false), b = run(true);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

TEST(GpuAmp, Float16TrainingWithScalerAndCheckpointing) {
  SKIP_WITHOUT_CUDA();
  test_support::TempDir dir("gpu");
  const fs::path cfg = dir.path() / "gpt.yaml";
  std::ofstream(cfg)
      << "device: cuda\nmodel: {name: resnet18, stem: cifar, checkpointing: blocks}\n"
         "data: {name: synthetic, shape: [3, 16, 16], train_samples: 256, "
         "val_samples: 64, batch_size: 32, workers: 1}\n"
         "train: {max_steps: 16}\noptim: {lr: 0.05}\namp: {enabled: true, dtype: float16}\n"
         "run: {log_every: 4, dir: "
      << (dir.path() / "run").string() << "}\n";
  auto loaded = engine::load_config(cfg.string(), {});
  config::Environment env;
  env.cuda_available = true;
  env.cuda_devices = static_cast<int64_t>(torch::cuda::device_count());
  config::check(loaded, env);
  fs::create_directories(loaded.cfg.run.dir);
  Trainer t(loaded);
  const auto r = t.fit();
  EXPECT_EQ(r.steps, 16);
  EXPECT_GT(r.last_eval.top1, 0.5);
  std::ifstream metrics(loaded.cfg.run.dir + "/metrics.jsonl");
  std::string text((std::istreambuf_iterator<char>(metrics)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"loss_scale\""), std::string::npos);
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
  // The caching allocator's peak over the window: at least the weights, within what it reserved.
  const auto record = nlohmann::json::parse(first);
  const double weights_mb =
      4.0 * static_cast<double>(models::parameter_count(t.model())) / (1024.0 * 1024.0);
  ASSERT_TRUE(record.contains("cuda_peak_mb")) << first;
  EXPECT_GT(record["cuda_peak_mb"].get<double>(), weights_mb) << first;
  EXPECT_LE(record["cuda_peak_mb"].get<double>(), record["cuda_reserved_mb"].get<double>())
      << first;
}

// A step that runs out of device memory (the allocator capped at 0.5% of the GPU) ends the run
// with one line naming the step, the batch, the allocator's figures and the doctor's remedies.
using GpuMemory = test_support::Cli;

TEST_F(GpuMemory, OutOfMemoryNamesTheStepTheBatchAndThePeak) {
  SKIP_WITHOUT_CUDA();
  const fs::path cfg = write("oom.yaml",
                             "device: cuda\nmodel: {name: resnet18}\n"
                             "data: {name: synthetic, shape: [3, 224, 224], train_samples: 256, "
                             "val_samples: 64, batch_size: 128, workers: 1}\n"
                             "train: {max_steps: 2}\nrun: {dir: " +
                                 (dir_ / "run").string() + "}\n");
  const auto r =
      sh("PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:0.005 \"$TRAINER\" "
         "--config '" +
         cfg.string() + "'");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("out of memory in step 1 at data.batch_size 128 x "
                       "train.grad_accum_steps 1 with "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("MiB in tensors at the peak of the step"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("trainer doctor --config"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("frame #"), std::string::npos) << r.err;  // no C++ stack trace
  // With profile.memory_snapshot the error names the allocator's history, written as a pickle
  // that torch.cuda._memory_viz renders.
  const auto snap =
      sh("PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:0.005 \"$TRAINER\" "
         "--config '" +
         cfg.string() + "' --set profile.memory_snapshot=true");
  EXPECT_EQ(snap.code, 1) << snap.err;
  const fs::path pickle = dir_ / "run" / "memory_snapshot.pickle";
  EXPECT_NE(snap.err.find("the allocator's history until then is in " + pickle.string()),
            std::string::npos)
      << snap.err;
  ASSERT_TRUE(fs::exists(pickle));
  EXPECT_EQ(test_support::read_file(pickle).substr(0, 1), "\x80");  // a pickle's protocol marker
  // Rendered where the venv's torch is at hand (scripts/gpu_check.sh's observe case always).
  const auto viz =
      sh("[ -x .venv/bin/python ] || exit 77; .venv/bin/python -m "
         "torch.cuda._memory_viz trace_plot '" +
         pickle.string() + "' -o '" + (dir_ / "memory.html").string() + "'");
  if (viz.code != 77) {
    EXPECT_EQ(viz.code, 0) << viz.err;
    EXPECT_GT(fs::file_size(dir_ / "memory.html"), 1000u);
  }
}

}  // namespace
}  // namespace trainer::engine
