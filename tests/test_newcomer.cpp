// End-to-end: what a new user meets first, as README.md spells it: the `train` command, one
// checkpoint argument (file or run dir) everywhere, the start-up lines in train.log, warnings for
// configs that silently under-deliver, and image folders without a val/ split.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "cli_fixture.h"
#include "image_files.h"

namespace {

namespace fs = std::filesystem;
using trainer::test_support::Cli;
using trainer::test_support::read_file;
using trainer::test_support::write_file;
using trainer::test_support::write_image_folder;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// `trainer train` is training; --resume and export --checkpoint take a run dir (its newest
// checkpoint); the final line calls the evaluation "val", as eval does.
TEST_F(Cli, TrainCommandAndRunDirsForResumeAndExport) {
  const auto a = dir_ / "a", b = dir_ / "b", empty = dir_ / "empty";
  auto r = run("train --config configs/synthetic.yaml --set train.epochs=1 --run-dir '" +
               a.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(read_file(a / "train.log"), "done: 16 steps")) << read_file(a / "train.log");
  EXPECT_TRUE(contains(read_file(a / "train.log"), "; val loss ")) << read_file(a / "train.log");

  // Another run dir continues from a's newest checkpoint (step 16) to the end of epoch 2.
  r = run("--config configs/synthetic.yaml --run-dir '" + b.string() + "' --resume '" + a.string() +
          "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto train = metrics(b, "train");
  ASSERT_FALSE(train.empty());
  EXPECT_EQ(train.front()["step"], 20);  // logs every 4 steps, from step 17 on
  EXPECT_EQ(train.back()["step"], 32);

  r = run("export --checkpoint '" + a.string() + "' --out '" + (dir_ / "w.safetensors").string() +
          "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "of mlp at step 16")) << r.out;

  fs::create_directories(empty);
  r = run("export --checkpoint '" + empty.string() + "' --out '" + (dir_ / "x").string() + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, empty.string() + " holds no checkpoint")) << r.err;
  r = run("--config configs/synthetic.yaml --run-dir '" + (dir_ / "c").string() + "' --resume '" +
          empty.string() + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "the run dir holds no checkpoint")) << r.err;
  r = run("--config configs/synthetic.yaml --resume '" + (dir_ / "absent").string() + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "neither a checkpoint file nor a run dir")) << r.err;
}

// Numbers print as written: a whole number is not in exponent form.
TEST_F(Cli, PrintConfigWritesWholeNumbersAsWritten) {
  auto r =
      run("--config configs/synthetic.yaml --print-config --set dist.init_timeout_s=300 "
          "--set optim.lr=0.0003");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "init_timeout_s: 300\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "lr: 0.0003\n")) << r.out;
  EXPECT_FALSE(contains(r.out, "e+")) << r.out;
}

// A warm-up longer than the run leaves the rate short of optim.lr: a warning at start, also in
// --dry-run, with the fraction reached (synthetic: 16 steps per epoch; 3 of 5 epochs -> 60%).
TEST_F(Cli, AWarmUpLongerThanTheRunIsAWarning) {
  auto r =
      run("--config configs/synthetic.yaml --dry-run --set train.epochs=3 "
          "--set sched.warmup_epochs=5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "warm-up (80 steps) is longer than the run (48 steps)")) << r.err;
  EXPECT_TRUE(contains(r.err, "ends at 60% of optim.lr")) << r.err;
  r = run("--config configs/synthetic.yaml --dry-run --set sched.warmup_epochs=1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(contains(r.err, "warm-up")) << r.err;
}

// model.pretrained leaves its trace in train.log: the file, the tensors read and the head that
// was re-initialised because its class count differs.
TEST_F(Cli, PretrainedWeightsAreLoggedInTrainLog) {
  const auto a = dir_ / "a", b = dir_ / "b", weights = dir_ / "w.safetensors";
  ASSERT_EQ(
      run("--config configs/synthetic.yaml --set train.max_steps=2 --run-dir '" + a.string() + "'")
          .code,
      0);
  auto r = run("export --checkpoint '" + a.string() + "' --out '" + weights.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  // "wrote FILE: N tensors of mlp at step 2"
  const auto colon = r.out.find(": ");
  const std::string tensors = r.out.substr(colon + 2, r.out.find(" tensors") - colon - 2);
  r =
      run("--config configs/synthetic.yaml --set train.max_steps=1 --set data.num_classes=3 "
          "--set model.pretrained_skip_head=true --set model.pretrained='" +
          weights.string() + "' --run-dir '" + b.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string log = read_file(b / "train.log");
  EXPECT_TRUE(contains(log, "initialised from " + weights.string() + ": " + tensors + " tensors"))
      << log;
  EXPECT_TRUE(contains(log, "re-initialised (model.pretrained_skip_head): ")) << log;
  EXPECT_TRUE(contains(log, "head.weight")) << log;
  // The start-up lines before the run dir existed are in the file too.
  EXPECT_LT(log.find("initialised from"), log.find("done:")) << log;
}

// eval (and predict, generate) of --config alone score its model.pretrained weights: the same
// result as the checkpoint they were exported from.
TEST_F(Cli, EvalOfAPretrainedConfigScoresItsWeights) {
  const auto a = dir_ / "a", weights = dir_ / "w.safetensors";
  ASSERT_EQ(
      run("--config configs/synthetic.yaml --set train.max_steps=3 --run-dir '" + a.string() + "'")
          .code,
      0);
  ASSERT_EQ(run("export --checkpoint '" + a.string() + "' --out '" + weights.string() + "'").code,
            0);
  auto from_checkpoint = run("eval --checkpoint '" + a.string() + "' --json");
  ASSERT_EQ(from_checkpoint.code, 0) << from_checkpoint.err;
  auto from_config = run("eval --config configs/synthetic.yaml --set model.pretrained='" +
                         weights.string() + "' --json");
  ASSERT_EQ(from_config.code, 0) << from_config.err;
  const auto c = nlohmann::json::parse(from_checkpoint.out);
  const auto p = nlohmann::json::parse(from_config.out);
  EXPECT_EQ(p["loss"], c["loss"]);
  EXPECT_EQ(p["top1"], c["top1"]);
  EXPECT_EQ(p["step"], 0);
  // Neither a checkpoint nor pretrained weights: a usage error saying both ways.
  auto r = run("eval --config configs/synthetic.yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "needs model.pretrained")) << r.err;
}

// An image folder without val/: a seeded data.val_fraction of train/ validates, said in a warning;
// files of formats that are not read are counted and named in one warning.
TEST_F(Cli, ImageFolderWithoutValSplitsTrainAndNamesSkippedFormats) {
  const auto root = dir_ / "images";
  write_image_folder(root, /*per_class=*/8, /*width=*/20, /*height=*/20);
  fs::remove_all(root / "val");
  write_file((root / "train" / "class0" / "x.webp").string(), {'R', 'I', 'F', 'F'});
  write_file((root / "train" / "class1" / "y.BMP").string(), {'B', 'M'});
  const std::string base =
      "--config configs/synthetic.yaml --dry-run --set data.name=imagefolder "
      "--set data.root='" +
      root.string() +
      "' --set data.image_size=16 --set data.resize_size=18 --set data.batch_size=2";
  auto r = run(base);
  ASSERT_EQ(r.code, 0) << r.err;
  // The default tenth: one of each class's 8 (at least one), 2 of the 16.
  EXPECT_TRUE(contains(r.err, (root / "val").string() + ": no such directory; validating on 2 of "
                                                        "train's images"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "skipped 1 .bmp, 1 .webp files")) << r.err;
  r = run(base + " --set data.val_fraction=0.5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "validating on 8 of train's images")) << r.err;
  r = run(base + " --set data.val_fraction=0");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "data.val_fraction: must be in (0, 1)")) << r.err;
}

}  // namespace
