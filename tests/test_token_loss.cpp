// A language model's loss normalised by the trained tokens of the whole step (transformers'
// Trainer with num_items_in_batch, TRL): on text whose mask leaves most targets out (the
// micro-batches and ranks holding very different numbers of trained tokens, some none), gradient
// accumulation, ddp and fsdp over two processes and tensor parallelism over two train as one
// process given the whole batch: every step's loss and gradient norm within 1e-5 relative, the
// final weights within 1e-5.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli_fixture.h"

namespace {

using trainer::test_support::Cli;
using trainer::test_support::max_abs_diff;
using trainer::test_support::read_file;
using trainer::test_support::step_file;
namespace fs = std::filesystem;

constexpr int kSteps = 20;

class TokenLoss : public Cli {
 protected:
  // 40 kB of Debian's fortunes as bytes, and its mask: 40 bytes of every 150 train. A window of
  // 32 targets holds from none to 32 trained ones, so 4 windows hold from a few to a hundred.
  fs::path text() {
    const std::string all = read_file("/usr/share/games/fortunes/cookie");
    const std::string text = all.substr(0, 40000);
    std::string mask(text.size(), '\0');
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = i % 150 < 40 ? 1 : 0;
    write("text.mask", mask);
    return write("text.txt", text);
  }

  // A small GPT on those bytes (vocabulary 256), no dropout, AdamW with weight decay, every step
  // logged with its gradient norm (clip_grad_norm computes it; 100 never clips here).
  std::string gpt(const fs::path& root) {
    return "--config configs/gpt_char.yaml --set data.root=" + root.string() +
           " --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=4 "
           "--set model.block_size=32 --set model.dropout=0 --set train.max_steps=" +
           std::to_string(kSteps) +
           " --set train.clip_grad_norm=100 --set run.log_every=1 --set run.eval_every=0 "
           "--set train.eval_at_end=false --set data.workers=1 --set run.progress=never "
           "--set run.threads=1 --set sched.warmup_steps=5";
  }

  // Each step's loss and gradient norm in `a` within 1e-5 relative of `b`'s.
  static void expect_same_steps(const fs::path& a, const fs::path& b) {
    const auto ma = metrics(a, "train"), mb = metrics(b, "train");
    ASSERT_EQ(ma.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(mb.size(), static_cast<size_t>(kSteps));
    for (size_t i = 0; i < ma.size(); ++i) {
      for (const char* key : {"loss", "grad_norm"}) {
        const double va = ma[i][key].get<double>(), vb = mb[i][key].get<double>();
        EXPECT_NEAR(va, vb, 1e-5 * std::abs(vb)) << key << " at step " << i + 1;
      }
    }
  }

  // The whole weights of `dir`'s last checkpoint (fsdp's pieces and tp's parts joined).
  fs::path exported(const fs::path& dir) {
    const fs::path out = dir / "model.safetensors";
    const auto r =
        run("export --checkpoint '" + (dir / "checkpoints" / step_file(kSteps)).string() +
            "' --out '" + out.string() + "'");
    EXPECT_EQ(r.code, 0) << r.err;
    return out;
  }
};

// One process with 8 windows a step; the same 8 as 2 micro-batches of 4; as 2 ranks of 4 under
// ddp and under fsdp; as 2 ranks of 2 micro-batches of 2 (ddp).
TEST_F(TokenLoss, AccumulationAndDataParallelEqualOneBatch) {
  const std::string args = gpt(text());
  const fs::path one = dir_ / "one", accum = dir_ / "accum", ddp = dir_ / "ddp",
                 fsdp = dir_ / "fsdp", both = dir_ / "ddp_accum";
  train(1, 8, args, one);
  train(1, 4, args + " --set train.grad_accum_steps=2", accum);
  train(2, 4, args + " --set dist.strategy=ddp", ddp);
  train(2, 4, args + " --set dist.strategy=fsdp", fsdp);
  train(2, 2, args + " --set dist.strategy=ddp --set train.grad_accum_steps=2", both);
  const fs::path whole = exported(one);
  for (const auto& dir : {accum, ddp, fsdp, both}) {
    SCOPED_TRACE(dir.filename().string());
    expect_same_steps(dir, one);
    EXPECT_LE(max_abs_diff(exported(dir), whole), 1e-5);
  }
}

// tp 2 (each rank half of the vocabulary's logits, the targets left out of the loss and its
// gradient) and tp 2 with 2 micro-batches equal one process.
TEST_F(TokenLoss, TensorParallelLeavesIgnoredTargetsOut) {
  const std::string args = gpt(text());
  const fs::path one = dir_ / "one", tp = dir_ / "tp", tp_accum = dir_ / "tp_accum";
  train(1, 8, args, one);
  train(2, 8, args + " --set dist.tp_size=2", tp);
  train(2, 4, args + " --set dist.tp_size=2 --set train.grad_accum_steps=2", tp_accum);
  const fs::path whole = exported(one);
  for (const auto& dir : {tp, tp_accum}) {
    SCOPED_TRACE(dir.filename().string());
    expect_same_steps(dir, one);
    EXPECT_LE(max_abs_diff(exported(dir), whole), 1e-5);
  }
}

// model.fused_kernels=on: the output layer and the loss in one, chunked over the tokens
// (losses/output_loss.h), on the CPU. GPT (tied output layer) under ddp over two ranks of two
// micro-batches of 2, and Llama (its own output layer), train as the unfused model: every step's
// loss and gradient norm within 1e-5 relative, the final weights within 1e-5.
TEST_F(TokenLoss, FusedOutputLossTrainsAsUnfused) {
  const fs::path root = text();
  const std::string llama =
      "--config configs/llama3_tiny.yaml --set data.root=" + root.string() +
      " --set model.block_size=32 --set train.max_steps=" + std::to_string(kSteps) +
      " --set train.clip_grad_norm=100 --set run.log_every=1 --set run.eval_every=0 "
      "--set train.eval_at_end=false --set run.progress=never --set run.threads=1";
  for (const auto& [name, args, ranks] :
       {std::tuple<std::string, std::string, int>{"gpt", gpt(root), 2}, {"llama", llama, 1}}) {
    SCOPED_TRACE(name);
    const fs::path off = dir_ / (name + "_off"), on = dir_ / (name + "_on");
    train(1, 8, args, off);
    train(ranks, ranks > 1 ? 2 : 8,
          args + " --set model.fused_kernels=on" +
              (ranks > 1 ? " --set train.grad_accum_steps=2" : ""),
          on);
    expect_same_steps(on, off);
    EXPECT_LE(max_abs_diff(exported(on), exported(off)), 1e-5);
  }
}

}  // namespace
