// Tensor parallelism (dist.tp_size) between real trainer processes over Gloo: the losses of tp 2
// and of tp 2 x dp 2 (ddp and fsdp) against one process's, the parameters a split layer holds
// whole trained as one process trains them, checkpoints resumed at other tensor-parallel sizes
// and strategies, what each rank holds and moves, and the config errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cli_fixture.h"

namespace {

using trainer::test_support::Cli;
using trainer::test_support::float_tensors;
using trainer::test_support::max_abs_diff;
using trainer::test_support::read_file;
using trainer::test_support::step_file;
namespace fs = std::filesystem;

// A small GPT on bytes of Debian's fortunes (vocabulary 256), 4 heads (tp 4 splits them too),
// no dropout, AdamW with weight decay, every step logged.
std::string gpt(int steps) {
  return "--config configs/gpt_char.yaml --set model.n_layer=2 --set model.n_embd=32 "
         "--set model.n_head=4 --set model.block_size=32 --set model.dropout=0 "
         "--set train.max_steps=" +
         std::to_string(steps) +
         " --set run.log_every=1 --set run.eval_every=0 --set train.eval_at_end=false "
         "--set data.workers=1 --set run.progress=never --set run.threads=1 "
         "--set sched.warmup_steps=5";
}

class TensorParallel : public Cli {
 protected:
  // Every step's loss within 1e-5 relative; the curves of equal length `steps`.
  static void expect_same_losses(const fs::path& a, const fs::path& b, size_t steps) {
    Cli::expect_same_losses(a, b, steps, /*absolute=*/0.0, /*relative=*/1e-5);
  }

  // Every float32 tensor of checkpoint `a` within `tolerance` of `b`'s of the same name, the two
  // holding the same names; each one that is not named with its largest difference.
  static void expect_same_tensors(const fs::path& a, const fs::path& b, double tolerance) {
    const auto ta = float_tensors(a), tb = float_tensors(b);
    ASSERT_FALSE(ta.empty()) << a;
    ASSERT_EQ(ta.size(), tb.size()) << a << " vs " << b;
    for (const auto& [name, va] : ta) {
      const auto it = tb.find(name);
      ASSERT_NE(it, tb.end()) << name << " is missing from " << b;
      ASSERT_EQ(it->second.size(), va.size()) << name;
      double worst = 0.0;
      for (size_t i = 0; i < va.size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(va[i]) - it->second[i]));
      }
      EXPECT_LE(worst, tolerance) << name;
    }
  }
};

// 50 steps of 8 samples: one process; tp 2 on 2 processes; tp 2 x dp 2 under ddp and under fsdp
// on 4. Also with 2 micro-batches of accumulation and clipping at 0.5 (the norm over every
// rank's parts, a whole parameter counted once).
TEST_F(TensorParallel, TwoAndTwoByTwoEqualOneProcess) {
  struct Case {
    std::string name, args;
    int micro_batches;
  };
  const std::vector<Case> cases = {
      {"plain", gpt(50) + " --set train.clip_grad_norm=0", 1},
      {"accum clip bias",
       gpt(50) + " --set train.grad_accum_steps=2 --set train.clip_grad_norm=0.5 "
                 "--set model.bias=true",
       2},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const int batch = 8 / c.micro_batches;
    const fs::path one = dir_ / "one", tp2 = dir_ / "tp2", ddp = dir_ / "ddp", fsdp = dir_ / "fsdp";
    train(1, batch, c.args, one);
    train(2, batch, c.args + " --set dist.tp_size=2", tp2);
    train(4, batch / 2, c.args + " --set dist.tp_size=2 --set dist.strategy=ddp", ddp);
    train(4, batch / 2, c.args + " --set dist.tp_size=2 --set dist.strategy=fsdp", fsdp);
    expect_same_losses(one, tp2, 50);
    expect_same_losses(one, ddp, 50);
    expect_same_losses(one, fsdp, 50);
    // The log gives the whole model's parameter count beside the rank's parts'.
    const auto count_after = [](const fs::path& log, const std::string& label) {
      const std::string text = read_file(log);
      const size_t at = text.find(label);
      return at == std::string::npos ? -1 : std::stoll(text.substr(at + label.size()));
    };
    const long long whole = count_after(one / "train.log", "] parameters: ");
    EXPECT_GT(whole, 0);
    EXPECT_EQ(count_after(tp2 / "train.log", "parameters of the whole model: "), whole);
    EXPECT_LT(count_after(tp2 / "train.log", "] parameters: "), whole);
    for (const auto& dir : {one, tp2, ddp, fsdp}) fs::remove_all(dir);
  }
}

// llama (configs/llama3_tiny.yaml, smaller): 4 query heads sharing 2 key/value heads, q/k/v
// biases and per-head q/k norms, an untied head. 30 steps of 8 samples with clipping: tp 2 on 2
// processes (each rank 2 query heads and 1 key/value head), and fsdp on 2 with every block
// checkpointed, equal one process.
TEST_F(TensorParallel, LlamaSplitsAsOneProcessComputes) {
  const std::string args =
      "--config configs/llama3_tiny.yaml --set model.n_layer=2 --set model.n_embd=32 "
      "--set model.n_head=4 --set model.n_kv_head=2 --set model.intermediate_size=48 "
      "--set model.block_size=32 --set model.qkv_bias=true --set model.qk_norm=true "
      "--set train.max_steps=30 --set train.clip_grad_norm=0.5 --set run.log_every=1 "
      "--set run.eval_every=0 --set train.eval_at_end=false --set data.workers=1 "
      "--set run.progress=never --set run.threads=1 --set sched.warmup_steps=5";
  const fs::path one = dir_ / "one", tp2 = dir_ / "tp2", fsdp = dir_ / "fsdp";
  train(1, 8, args, one);
  train(2, 8, args + " --set dist.tp_size=2", tp2);
  train(2, 4, args + " --set dist.strategy=fsdp --set model.checkpointing=blocks", fsdp);
  expect_same_losses(one, tp2, 30);
  expect_same_losses(one, fsdp, 30);
}

// Every kind of parameter that a split layer holds whole trains under tp 2 as one process trains
// it: llama's per-head q/k norms (Qwen 3's qk_norm: one weight scales every head, while each rank
// computes only its own heads) beside its column-parallel q/k/v biases (Qwen 2's, split with
// their rows), and gpt's row-parallel biases (added once after the all-reduce) and layer norms.
// 8 AdamW steps at lr 3e-3 without warmup or clipping, so that a gradient summed over half the
// heads moves a weight by a good part of a step (2.7e-2 after 8): every loss within 2e-6 (4 ulps),
// and every parameter and AdamW moment of the last checkpoint (the whole tensors; a whole one
// rank 0's) within 1e-5 of one process's. AdamW's eps is 1e-6, not 1e-8: the first steps move
// each weight by about lr x sign(gradient), and the summation order's rounding of a gradient
// that is all but zero (the key bias's, zero but for rounding) would flip that sign.
TEST_F(TensorParallel, WholeParametersOfSplitLayersTrainAsOneProcess) {
  const std::string common =
      " --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=4 "
      "--set model.block_size=32 --set train.max_steps=8 --set train.clip_grad_norm=0 "
      "--set optim.lr=0.003 --set optim.eps=1e-6 --set sched.name=constant "
      "--set sched.warmup_steps=0 --set run.checkpoint_every=8 --set run.log_every=1 "
      "--set run.eval_every=0 --set train.eval_at_end=false --set data.workers=1 "
      "--set run.progress=never --set run.threads=1";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"llama qk_norm qkv_bias",
       "--config configs/llama3_tiny.yaml --set model.n_kv_head=2 "
       "--set model.intermediate_size=48 --set model.qkv_bias=true --set model.qk_norm=true" +
           common},
      {"gpt bias",
       "--config configs/gpt_char.yaml --set model.dropout=0 --set model.bias=true" + common},
  };
  for (const auto& [name, args] : cases) {
    SCOPED_TRACE(name);
    const fs::path one = dir_ / "one", tp2 = dir_ / "tp2";
    train(1, 8, args, one);
    train(2, 8, args + " --set dist.tp_size=2", tp2);
    Cli::expect_same_losses(one, tp2, 8, /*absolute=*/2e-6);
    expect_same_tensors(one / "checkpoints" / step_file(8), tp2 / "checkpoints" / step_file(8),
                        1e-5);
    for (const auto& dir : {one, tp2}) fs::remove_all(dir);
  }
}

// tp 2 to step 10, tp 1 to 20, tp 4 (dp 1) to 30, tp 2 x fsdp 2 to 40: the losses of the
// uninterrupted run. The checkpoints hold whole tensors (fsdp's parts joined when read): each
// exports the uninterrupted run's weights, and a corrupt part falls back to the previous one.
TEST_F(TensorParallel, CheckpointsReshardAcrossSizesAndStrategies) {
  const std::string args = gpt(40) + " --set train.clip_grad_norm=0.5 --set run.keep_last=20";
  const fs::path whole = dir_ / "whole", parts = dir_ / "parts";
  train(1, 8, args + " --set run.checkpoint_every=10", whole);
  train(2, 8, args + " --set dist.tp_size=2 --set train.stop_at_step=10", parts);
  train(1, 8, args + " --set train.stop_at_step=20 --resume auto", parts);
  train(4, 8, args + " --set dist.tp_size=4 --set train.stop_at_step=30 --resume auto", parts);
  train(4, 4,
        args +
            " --set dist.tp_size=2 --set dist.strategy=fsdp --set run.checkpoint_every=5 "
            "--resume auto",
        parts);
  expect_same_losses(whole, parts, 40);
  const auto exported = [&](const fs::path& dir, int step, const std::string& name) {
    const fs::path out = dir_ / name;
    const auto r = run("export --checkpoint '" + (dir / "checkpoints" / step_file(step)).string() +
                       "' --out '" + out.string() + "'");
    EXPECT_EQ(r.code, 0) << r.err;
    return out;
  };
  for (const int step : {10, 30, 40}) {  // tp 2 (ddp), tp 4, tp 2 x fsdp 2
    EXPECT_LE(max_abs_diff(exported(whole, step, "whole.safetensors"),
                           exported(parts, step, "parts.safetensors")),
              1e-5)
        << "step " << step;
  }
  // The manifest records the layout; a part of step 40 damaged: resuming takes step 35.
  const auto meta = read_file(parts / "checkpoints" / step_file(40));
  EXPECT_NE(meta.find("tensor_parallel"), std::string::npos);
  EXPECT_NE(meta.find("@tp1/2/1/1"), std::string::npos);  // a row-parallel weight's part
  const fs::path shard =
      parts / "checkpoints" / "step_00000040.shards" / "rank_00001_of_00004.safetensors";
  ASSERT_TRUE(fs::exists(shard));
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    f.put('\x5a').put('\x5a').put('\x5a');
  }
  const auto r = run("launch --standalone --nproc-per-node 2 -- " + args +
                     " --set dist.tp_size=2 --set train.max_steps=41 --set data.batch_size=8 "
                     "--resume auto --run-dir '" +
                     parts.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("step_00000035"), std::string::npos) << r.err;
}

// What a rank holds at tp 2 against one process (parameters, gradients, AdamW's moments: at most
// 0.55x), and the all-reduces of a step against their analytic count: per block two in the
// forward and two in the backward, the embedding's and lm_head's input gradient's, each of
// B x T x C floats, and the cross-entropy's three of B x T.
TEST_F(TensorParallel, RanksHoldHalfTheStateAndMoveTheAnalyticBytes) {
  const int64_t B = 4, T = 64, C = 128, L = 2;
  const std::string args =
      "bench --config configs/gpt_char.yaml --set model.n_layer=2 --set model.n_head=4 "
      "--set model.n_embd=128 --set model.block_size=64 --set model.vocab_size=4096 "
      "--set data.batch_size=4 --set model.dropout=0 --set data.workers=0 --set run.threads=1 "
      "--steps 2 --warmup 1 --fixed-batch";
  const fs::path one = dir_ / "one.json", two = dir_ / "two.json";
  auto r = run(args + " --json '" + one.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("launch --standalone --nproc-per-node 2 -- " + args + " --set dist.tp_size=2 --json '" +
          two.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto a = nlohmann::json::parse(read_file(one)), b = nlohmann::json::parse(read_file(two));
  for (const char* part : {"params", "grads", "optimizer", "total"}) {
    EXPECT_LE(b["held_bytes"][part].get<double>(), 0.55 * a["held_bytes"][part].get<double>())
        << part;
  }
  const double analytic = 4.0 * static_cast<double>(B * T * C * (4 * L + 2) + 3 * B * T);
  const double all_reduce = b["comm_bytes_per_step_by_kind"]["all_reduce"].get<double>();
  EXPECT_GE(all_reduce, analytic);
  EXPECT_LT(all_reduce, analytic + 1024.0);  // the step's loss and flags
}

// Sizes that do not split, and settings the tensor-parallel step does not support: exit 2 naming
// the key and the divisibility.
TEST_F(TensorParallel, ConfigErrorsNameWhatDoesNotDivide) {
  struct Case {
    int ranks;
    std::string args, expected;
  };
  const std::vector<Case> cases = {
      {2, gpt(2) + " --set dist.tp_size=4", "does not divide the job's 2 processes"},
      {3, gpt(2) + " --set dist.tp_size=2", "does not divide the job's 3 processes"},
      {2, gpt(2) + " --set model.n_head=1 --set dist.tp_size=2",
       "model.n_head 1 does not split over dist.tp_size 2"},
      {2, gpt(2) + " --set model.vocab_size=257 --set dist.tp_size=2",
       "model.vocab_size 257 does not split over dist.tp_size 2"},
      {4,
       "--config configs/llama3_tiny.yaml --set train.max_steps=2 --set data.workers=0 "
       "--set dist.tp_size=4",
       "model.n_head 4 and model.n_kv_head 2 must both split over dist.tp_size 4"},
      {2, gpt(2) + " --set dist.tp_size=2 --set train.label_smoothing=0.1",
       "train.label_smoothing"},
      {2,
       "--config configs/fashion_mnist_mlp.yaml --set train.max_steps=2 --set data.workers=0 "
       "--set dist.tp_size=2",
       "does not split its layers"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = run("launch --standalone --nproc-per-node " + std::to_string(c.ranks) + " -- " +
                       c.args + " --run-dir '" + (dir_ / "bad").string() + "'");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
  }
}

// `trainer doctor --config` prices tp x dp at the job's world size: the state split over the
// tensor-parallel group shrinks with tp_size, below one process's whole step.
TEST_F(TensorParallel, DoctorEstimatesTheMemoryPerProcess) {
  std::map<int, nlohmann::json> memory;
  for (const int tp : {1, 2, 4}) {
    const auto config = write("doctor" + std::to_string(tp) + ".yaml",
                              "base: " + std::string(TRAINER_SOURCE_DIR) +
                                  "/configs/gpt_char.yaml\n"
                                  "model: {n_layer: 4, n_embd: 256, n_head: 4, block_size: 64}\n"
                                  "data: {batch_size: 2}\ndist: {tp_size: " +
                                  std::to_string(tp) + "}\n");
    const auto r = sh("WORLD_SIZE=4 \"$TRAINER\" doctor --json --config '" + config.string() + "'");
    ASSERT_NE(r.out.find('{'), std::string::npos) << r.err;
    memory[tp] = nlohmann::json::parse(r.out.substr(r.out.find('{')))["memory"];
    EXPECT_EQ(memory[tp]["tp_size"], tp);
  }
  const double state = memory[1]["params_bytes"].get<double>() +
                       memory[1]["optimizer_bytes"].get<double>();  // params, moments
  EXPECT_NEAR(memory[1]["tp_bytes"].get<double>(), memory[1]["float32_bytes"].get<double>(),
              0.01 * state);
  // Each doubling of tp_size halves the state's share and splits activations further.
  EXPECT_GE(memory[1]["tp_bytes"].get<double>() - memory[2]["tp_bytes"].get<double>(),
            state / 2 * 0.99);
  EXPECT_GE(memory[2]["tp_bytes"].get<double>() - memory[4]["tp_bytes"].get<double>(),
            state / 4 * 0.99);
}

}  // namespace
