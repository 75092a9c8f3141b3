// Checkpoints and resume, end to end: exact continuation after a planned stop and SIGTERM, corrupt
// checkpoints, mismatched configs, export. (kill -9 and failing saves: test_failures.cpp.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "cli_fixture.h"

namespace {

namespace fs = std::filesystem;
using trainer::test_support::Cli;
using trainer::test_support::float_tensors;
using trainer::test_support::read_file;
using trainer::test_support::step_file;
using trainer::test_support::write_image_folder;

// Every record of metrics.jsonl without its timing field, one string per line.
std::vector<std::string> records(const fs::path& run_dir) {
  std::vector<std::string> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    j.erase("samples_per_sec");
    out.push_back(j.dump());
  }
  return out;
}

// Synthetic data with dropout, gradient accumulation, AdamW, warmup + cosine, 2 loader workers.
const std::string kSynthetic =
    "--config configs/synthetic.yaml --set train.grad_accum_steps=2 --set model.dropout=0.2 "
    "--set optim.name=adamw --set optim.lr=0.01 --set sched.name=cosine "
    "--set sched.warmup_steps=3 --set data.workers=2 --set run.log_every=1 --set train.epochs=3 "
    "--set run.progress=never";

TEST_F(Cli, ResumeAfterAPlannedStopIsBitwiseExact) {
  const auto a = dir_ / "a", b = dir_ / "b";
  ASSERT_EQ(run(kSynthetic + " --run-dir '" + a.string() + "'").code, 0);
  // 512 samples / (32 x 2) = 8 steps per epoch: stop mid-epoch 2.
  auto r = run(kSynthetic + " --run-dir '" + b.string() + "' --set train.stop_at_step=11");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(b / "checkpoints" / "step_00000011.safetensors"));
  EXPECT_EQ(records(b).size(), 11u + 1u);  // 11 train lines, the evaluation after epoch 1
  r = run(kSynthetic + " --run-dir '" + b.string() + "' --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("resumed from"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("train.stop_at_step changed: 11 -> 0"), std::string::npos) << r.err;
  ASSERT_EQ(records(a).size(), 24u + 3u);
  EXPECT_EQ(records(a), records(b));
}

// A resume with more steps stretches the cosine schedule: it says so with the learning rates of
// the next step, the checkpoint's run's (as an uninterrupted run of the old length logs it) and
// the new one's (as the resumed run logs it). The same schedule resumes without the line.
TEST_F(Cli, ResumingWithAnotherScheduleSaysHowTheLearningRateChanges) {
  const auto a = dir_ / "a", b = dir_ / "b";
  const auto lr_at = [](const fs::path& dir, int64_t step) {
    std::ifstream in(dir / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.at("split") == "train" && j.at("step") == step) return j.at("lr").get<double>();
    }
    return -1.0;
  };
  const std::string run_a = kSynthetic + " --set train.epochs=0 --set train.max_steps=20";
  ASSERT_EQ(run(run_a + " --run-dir '" + a.string() + "'").code, 0);
  auto r = run(run_a + " --run-dir '" + b.string() + "' --set train.stop_at_step=10");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run(run_a + " --run-dir '" + b.string() + "' --set train.stop_at_step=12 --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("another learning-rate schedule"), std::string::npos) << r.err;
  r = run(kSynthetic + " --set train.epochs=0 --set train.max_steps=40 --run-dir '" + b.string() +
          "' --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t at = r.err.find(
      "with another learning-rate schedule (over 40 steps, the "
      "checkpoint's run over 20): the next step's learning rate is ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const std::string rest = r.err.substr(r.err.find("rate is ", at) + 8);
  const double now = std::stod(rest);
  const double then = std::stod(rest.substr(rest.find(", ") + 2));
  EXPECT_NEAR(then, lr_at(a, 13), 1e-5 * lr_at(a, 13));  // printed to 6 digits
  EXPECT_NEAR(now, lr_at(b, 13), 1e-5 * now);
  EXPECT_GT(now, then);
}

// run.checkpoint_async: the checkpoints are written in the background, each log line says how
// long training was blocked, and a run stopped mid-epoch resumes as the synchronous one ends.
TEST_F(Cli, AsynchronousCheckpointsResumeBitwise) {
  const std::string every = kSynthetic + " --set run.checkpoint_every=2";
  const auto a = dir_ / "a", b = dir_ / "b";
  ASSERT_EQ(run(every + " --run-dir '" + a.string() + "'").code, 0);
  auto r = run(every + " --set run.checkpoint_async=true --set train.stop_at_step=11 --run-dir '" +
               b.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("step_00000010.safetensors ("), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("training blocked"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(b / "checkpoints" / "step_00000011.safetensors"));
  r = run(every + " --set run.checkpoint_async=true --resume auto --run-dir '" + b.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("resumed from"), std::string::npos) << r.err;
  ASSERT_EQ(records(a).size(), 24u + 3u);
  EXPECT_EQ(records(a), records(b));
}

// data.mix of two synthetic sets of different noise, resumed mid-epoch; its config.yaml holds the
// list and trains the same; the proportions are logged.
TEST_F(Cli, MixedDataResumesBitwiseAndItsConfigRoundTrips) {
  const std::string mix =
      kSynthetic +
      " --set data.name=mix --set 'data.mix=[{name: synthetic, train_samples: 384, noise: 0.2, "
      "weight: 3}, {name: synthetic, train_samples: 128, noise: 1.5, weight: 1}]'";
  const auto a = dir_ / "a", b = dir_ / "b", c = dir_ / "c";
  auto r = run(mix + " --run-dir '" + a.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("data.mix: data.mix[0] (synthetic) 75.0% (384 samples an epoch, 1.00 "
                       "passes over its 384); data.mix[1] (synthetic) 25.0% (128 samples"),
            std::string::npos)
      << r.err;
  ASSERT_EQ(run(mix + " --run-dir '" + b.string() + "' --set train.stop_at_step=11").code, 0);
  r = run(mix + " --run-dir '" + b.string() + "' --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(records(a).size(), 24u + 3u);
  EXPECT_EQ(records(a), records(b));
  // The run's own config.yaml trains the same run.
  r = run("--config '" + (a / "config.yaml").string() + "' --run-dir '" + c.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(records(a), records(c));

  r = run(kSynthetic + " --set data.name=mix --set 'data.mix=[{name: synthetic}, {name: synth}]'");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("data.mix[1].name: unknown data set 'synth' for a part; registered: "),
            std::string::npos)
      << r.err;
}

TEST_F(Cli, ResumeWithAugmentationAndSeveralWorkersIsBitwiseExact) {
  write_image_folder(dir_ / "images", /*per_class=*/10, /*width=*/40, /*height=*/30);
  const std::string config =
      "--config configs/synthetic.yaml --set model.hidden=[32] --set data.name=imagefolder "
      "--set data.root='" +
      (dir_ / "images").string() +
      "' --set data.image_size=12 --set data.resize_size=14 --set data.hflip=0.5 "
      "--set data.batch_size=4 --set data.workers=3 --set run.log_every=1 "
      "--set run.progress=never --set train.epochs=2";
  const auto a = dir_ / "a", b = dir_ / "b";
  ASSERT_EQ(run(config + " --run-dir '" + a.string() + "'").code, 0);
  ASSERT_EQ(run(config + " --run-dir '" + b.string() + "' --set train.stop_at_step=7").code, 0);
  auto r = run(config + " --run-dir '" + b.string() + "' --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(records(a).size(), 10u + 2u);
  EXPECT_EQ(records(a), records(b));
}

// A run long enough to be interrupted: 50 ms steps, constant learning rate (so the step limit does
// not shape the schedule), a checkpoint after every step.
const std::string kSlow =
    "--config configs/synthetic.yaml --set model.hidden=[1024,1024] --set data.shape=[1,32,32] "
    "--set data.train_samples=4096 --set data.batch_size=256 --set data.workers=1 "
    "--set run.log_every=1 --set run.progress=never --set run.checkpoint_every=1 "
    "--set run.keep_last=2 --set optim.lr=0.01 --set data.noise=4 --set data.num_classes=10";

TEST_F(Cli, SigtermOrSigintMidEpochCheckpointsExitsZeroAndResumesExactly) {
  const auto a = dir_ / "a", b = dir_ / "b";
  ASSERT_EQ(run(kSlow + " --set train.max_steps=40 --run-dir '" + a.string() + "'").code, 0);
  // Interrupted once two steps are logged; the long max_steps keeps it running until then.
  auto r = sh("\"$TRAINER\" " + kSlow + " --set train.max_steps=100000 --run-dir '" + b.string() +
              "' & pid=$!\n"
              "until [ \"$(grep -c train '" +
              (b / "metrics.jsonl").string() +
              "' 2>/dev/null)\" -ge 2 ]; do sleep 0.02; done\n"
              "kill -TERM $pid; wait $pid; echo \"exit=$?\"");
  EXPECT_NE(r.out.find("exit=0"), std::string::npos) << r.out << r.err;
  const auto stopped = trainer::test_support::Cli::metrics(b, "train");
  ASSERT_FALSE(stopped.empty());
  const int64_t k = stopped.back()["step"].get<int64_t>();
  ASSERT_LT(k, 40) << "the signal came too late to test a resume";
  EXPECT_TRUE(fs::exists(b / "checkpoints" / trainer::test_support::step_file(k)));
  // Resumed, then interrupted again, by SIGINT (Ctrl-C) this time, two steps later.
  r = sh("\"$TRAINER\" " + kSlow + " --set train.max_steps=100000 --run-dir '" + b.string() +
         "' --resume auto & pid=$!\n"
         "until [ \"$(cat '" +
         (b / "metrics.jsonl").string() + "' | grep -c train)\" -ge " + std::to_string(k + 2) +
         " ]; do sleep 0.02; done\n"
         "kill -INT $pid; wait $pid; echo \"exit=$?\"");
  EXPECT_NE(r.out.find("exit=0"), std::string::npos) << r.out << r.err;
  const int64_t k2 = trainer::test_support::Cli::metrics(b, "train").back()["step"].get<int64_t>();
  ASSERT_GT(k2, k);
  ASSERT_LT(k2, 40) << "the signal came too late to test a resume";
  r = run(kSlow + " --set train.max_steps=40 --run-dir '" + b.string() + "' --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(records(a), records(b));
}

TEST_F(Cli, CorruptNewestCheckpointFallsBackToThePreviousOne) {
  const auto b = dir_ / "b";
  ASSERT_EQ(run(kSynthetic + " --run-dir '" + b.string() +
                "' --set run.checkpoint_every=4 "
                "--set train.stop_at_step=12")
                .code,
            0);
  const auto newest = b / "checkpoints" / "step_00000012.safetensors";
  fs::resize_file(newest, fs::file_size(newest) / 2);
  auto r =
      run(kSynthetic + " --run-dir '" + b.string() + "' --resume auto --set train.max_steps=13");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("step_00000012.safetensors"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("trying the previous checkpoint"), std::string::npos) << r.err;
  EXPECT_NE(
      r.err.find("resumed from " + (b / "checkpoints" / "step_00000008.safetensors").string()),
      std::string::npos)
      << r.err;
  // Asked for by path, the corrupt file is an error.
  r = run(kSynthetic + " --run-dir '" + (dir_ / "c").string() + "' --resume '" + newest.string() +
          "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(newest.string()), std::string::npos) << r.err;
  r = run(kSynthetic + " --resume '" + (dir_ / "absent").string() + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--resume"), std::string::npos) << r.err;
}

TEST_F(Cli, ResumingIntoAnotherModelNamesWhatDiffers) {
  const auto b = dir_ / "b";
  ASSERT_EQ(run(kSynthetic + " --run-dir '" + b.string() + "' --set train.stop_at_step=3").code, 0);
  auto r = run(kSynthetic + " --run-dir '" + b.string() +
               "' --resume auto --set model.hidden=[128] --set optim.name=sgd");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("model.hidden: is [128] but the checkpoint"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("was written with [64]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("optim.name: is sgd"), std::string::npos) << r.err;
}

TEST_F(Cli, ExportWritesPlainWeights) {
  const auto b = dir_ / "b";
  ASSERT_EQ(run(kSynthetic + " --run-dir '" + b.string() + "' --set train.max_steps=2").code, 0);
  const auto out = dir_ / "w.safetensors";
  auto r =
      run("export --checkpoint '" + (b / "checkpoints" / "step_00000002.safetensors").string() +
          "' --out '" + out.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("tensors of mlp at step 2"), std::string::npos) << r.out;
  // The weights initialise a new run (and are rejected by a model of another shape).
  r = run(kSynthetic + " --dry-run --set model.pretrained='" + out.string() + "'");
  EXPECT_EQ(r.code, 0) << r.err;
  r = run(kSynthetic + " --dry-run --set model.pretrained='" + out.string() +
          "' --set data.num_classes=5");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("with other shapes"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("pretrained_skip_head"), std::string::npos) << r.err;
  r = run(kSynthetic + " --dry-run --set model.pretrained='" + out.string() +
          "' --set data.num_classes=5 --set model.pretrained_skip_head=true");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(run("export --checkpoint nowhere --out x").code, 2);
}

// A checkpoint written before optim.impl existed (tests/data/checkpoint_v1: the trainer on
// LibTorch's torch::optim, whose state names these are) resumes with every implementation, and
// the resumed steps' losses are those of that version's own uninterrupted run (within rounding:
// its Adam kept the moments with mul_ and add_ where torch.optim uses lerp_).
TEST_F(Cli, OldCheckpointsResumeWithEveryOptimizerImplementation) {
  for (const std::string opt : {"adamw", "sgd"}) {
    const std::string fixture = "tests/data/checkpoint_v1/" + opt;
    std::vector<double> reference;
    std::ifstream in(std::string(TRAINER_SOURCE_DIR) + "/" + fixture + "_metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["split"] == "train") reference.push_back(j["loss"].get<double>());
    }
    ASSERT_EQ(reference.size(), 6u);
    for (const std::string impl : {"fused", "foreach", "loop"}) {
      SCOPED_TRACE(opt + " " + impl);
      const fs::path run_dir = dir_ / (opt + "_" + impl);
      const auto r = run("--config " + fixture + ".yaml --set optim.impl=" + impl + " --resume " +
                         fixture + "_step3.safetensors --run-dir '" + run_dir.string() + "'");
      ASSERT_EQ(r.code, 0) << r.err;
      const auto resumed = losses(run_dir);
      ASSERT_EQ(resumed.size(), 3u);  // steps 4 to 6
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_NEAR(resumed[k], reference[3 + k], 1e-5 * std::abs(reference[3 + k]))
            << "step " << k + 4;
      }
    }
  }
}

}  // namespace

// A tied gpt (lm_head.weight is transformer.wte.weight) stores that tensor once, as safetensors'
// save_model stores shared tensors: its checkpoint is the untied model's less the head and the
// head's two AdamW moments. It resumes bitwise (saved synchronously and asynchronously), and
// export and eval read the head under its own name again.
TEST_F(Cli, TiedWeightsAreStoredOnceAndResumeBitwise) {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
  const auto corpus = write("corpus.txt", text);
  const std::string gpt = "--config configs/gpt_char.yaml --set data.root='" + corpus.string() +
                          "' --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 "
                          "--set model.block_size=16 --set data.batch_size=4 --set train.epochs=0 "
                          "--set train.max_steps=6 --set run.log_every=1 --set run.progress=never "
                          "--set run.eval_every=3 ";
  const auto a = dir_ / "a", b = dir_ / "b", c = dir_ / "c", untied = dir_ / "u";
  ASSERT_EQ(run(gpt + "--run-dir '" + a.string() + "'").code, 0);
  for (const auto& [dir, extra] : std::vector<std::pair<fs::path, std::string>>{
           {b, ""}, {c, "--set run.checkpoint_async=true "}}) {
    auto r = run(gpt + extra + "--set train.stop_at_step=3 --run-dir '" + dir.string() + "'");
    ASSERT_EQ(r.code, 0) << r.err;
    r = run(gpt + extra + "--resume auto --run-dir '" + dir.string() + "'");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("resumed from"), std::string::npos) << r.err;
    for (const char* split : {"train", "val"}) {
      const auto ma = metrics(a, split), mb = metrics(dir, split);
      ASSERT_EQ(ma.size(), mb.size()) << split;
      for (size_t i = 0; i < ma.size(); ++i) {
        EXPECT_EQ(ma[i]["loss"].get<double>(), mb[i]["loss"].get<double>()) << split << " " << i;
      }
    }
  }
  auto r = run(gpt + "--set model.tie_embeddings=false --set train.stop_at_step=3 --run-dir '" +
               untied.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const auto& dir : {b, c}) {
    const auto tied = dir / "checkpoints" / step_file(3);
    const auto names = float_tensors(tied, "model.");
    EXPECT_EQ(names.count("model.lm_head.weight"), 0u);
    ASSERT_EQ(names.count("model.transformer.wte.weight"), 1u);
    const double head = static_cast<double>(names.at("model.transformer.wte.weight").size() * 4);
    const double saved = static_cast<double>(fs::file_size(untied / "checkpoints" / step_file(3))) -
                         static_cast<double>(fs::file_size(tied));
    EXPECT_NEAR(saved, 3 * head, 2048.0) << "head " << head;  // the header's lines differ a little
  }
  const auto out = dir_ / "w.safetensors";
  r = run("export --checkpoint '" + (b / "checkpoints" / step_file(6)).string() + "' --out '" +
          out.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto weights = float_tensors(out);
  ASSERT_EQ(weights.count("lm_head.weight"), 1u);
  EXPECT_EQ(weights.at("lm_head.weight"), weights.at("transformer.wte.weight"));
  r = run("eval --checkpoint '" + b.string() + "' --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const double val = metrics(a, "val").back()["loss"].get<double>();
  EXPECT_NEAR(nlohmann::json::parse(r.out).at("loss").get<double>(), val, 1e-6 * val);
}
