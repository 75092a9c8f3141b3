// On a GPU: the chunked output loss (losses/output_loss.h) against the unfused one under bfloat16
// autocast at GPT-2's vocabulary, and trainer bench --kernels' rows (engine/use/kernel_bench.h).
// Every test skips when no GPU is visible.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>
#include <string>
#include <tuple>

#include "engine/measure/memory.h"
#include "engine/use/kernel_bench.h"
#include "gpu_kernel_checks.h"
#include "losses/loss.h"
#include "losses/output_loss.h"
#include "nn/aligned_linear.h"
#include "nn/autocast.h"
#include "nn/fused/fused_ops.h"

namespace trainer {
namespace {

// 1,000 tokens over GPT-2's 50,257-row vocabulary (a padded product), a tenth of the targets
// ignored. The logits of both are the same bfloat16 products, so the losses agree within float32
// sums; the gradients within bfloat16 rounding (2^-7 of the largest element; the unfused weight
// gradient is one bfloat16 product over all rows, the chunked one a float32 sum of per-chunk
// products). The chunked loss's peak memory holds no [tokens, vocabulary] tensor.
TEST(GpuOutputLoss, ChunkedEqualsUnfusedUnderBfloat16) {
  SKIP_WITHOUT_CUDA();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(0);
  const int64_t n = 1000, c = 768, v = 50257;
  const auto hidden = torch::randn({n, c}, cuda);
  const auto weight = 0.02 * torch::randn({v, c}, cuda);
  auto targets = torch::randint(v, {n}, cuda.dtype(torch::kLong));
  targets.index_put_({torch::arange(0, n, 10, cuda.dtype(torch::kLong))}, losses::kIgnoreIndex);
  const auto unfused = losses::loss_registry().get("cross_entropy")(config::TrainConfig{});
  const auto chunked = losses::output_loss(config::TrainConfig{});
  struct Out {
    torch::Tensor loss, grad_h, grad_w;
    int64_t peak = 0;
  };
  const auto run = [&](bool fused) {
    auto h = hidden.clone().requires_grad_(true), w = weight.clone().requires_grad_(true);
    torch::cuda::synchronize();
    engine::reset_cuda_peak(0);
    const int64_t base = engine::cuda_memory(0).peak;  // the bytes held now
    torch::Tensor loss;
    {
      nn::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16, true);
      loss = fused ? chunked(h, w, targets) : unfused(nn::aligned_linear(h, w), targets);
    }
    loss.backward();
    torch::cuda::synchronize();
    const int64_t peak = engine::cuda_memory(0).peak - base;
    return Out{loss.detach(), h.grad(), w.grad(), peak};
  };
  const auto want = run(false), got = run(true);
  EXPECT_NEAR(got.loss.item<double>(), want.loss.item<double>(),
              1e-5 * std::abs(want.loss.item<double>()));
  for (const auto& [name, a, b] :
       {std::tuple<std::string, torch::Tensor, torch::Tensor>{"hidden", got.grad_h, want.grad_h},
        {"weight", got.grad_w, want.grad_w}}) {
    const double err = (a - b).abs().max().item<double>(), top = b.abs().max().item<double>();
    EXPECT_LE(err, std::ldexp(1.0, -7) * top) << "grad of " << name;
  }
  const int64_t logits_bytes = n * nn::aligned_columns(v) * 2;
  EXPECT_GE(want.peak, logits_bytes);
  EXPECT_LT(got.peak, want.peak - logits_bytes / 2) << "unfused peak " << want.peak;
}

// Every kernel's forward and forward + backward, fused and ATen, with a rate under the device's
// own copy rate times 1.1 (bytes counted once each: a kernel cannot beat the copy by more).
TEST(GpuKernels, BenchKernelsTimesEveryKernel) {
  SKIP_WITHOUT_CUDA();
  if (!nn::fused_kernels_built()) GTEST_SKIP() << "built without the kernels";
  const auto report = engine::bench_kernels(torch::Device(torch::kCUDA, 0), /*repeats=*/2);
  EXPECT_GT(report.copy_gbps, 0.0);
  std::set<std::string> names;
  for (const auto& r : report.rows) {
    names.insert(r.name);
    EXPECT_GT(r.fused_gbps, 0.0) << r.name;
    EXPECT_GT(r.aten_gbps, 0.0) << r.name;
    EXPECT_LT(r.fused_gbps, 1.1 * report.copy_gbps) << r.name;
  }
  EXPECT_EQ(names.size(), report.rows.size());
  EXPECT_EQ(report.rows.size(), 16u);  // 8 kernels, 2 passes each
}

}  // namespace
}  // namespace trainer
