// The NF4 dequantization kernel (nn/quant/nf4_cuda.cu) against the CPU path it replaces on a GPU
// (nn/quant/nf4.h's dequantize, which equals bitsandbytes' on the CPU): bit for bit, nested and
// not, float32 / bfloat16 / float16 out, ragged last blocks, an odd count; and a quantized
// layer's product on the GPU against the CPU's. Every test skips when no GPU is visible.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "nn/quant/nf4.h"
#include "nn/quant/quantized_weight.h"

namespace trainer::nn::quant {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU visible"

TEST(GpuQuant, Nf4DequantizationEqualsTheCpuPath) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(0);
  const std::vector<std::vector<int64_t>> shapes = {{64, 128}, {3, 37}, {1, 1}, {4096, 1000}};
  for (const auto& shape : shapes) {
    for (const bool nested : {true, false}) {
      const auto w = torch::randn(shape) * 0.05;
      const auto q = quantize_nf4(w, 64, nested);
      const auto on_gpu = q.to(torch::Device(torch::kCUDA, 0));
      for (const auto out : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
        SCOPED_TRACE(c10::str(shape, nested ? " nested " : " plain ", out));
        EXPECT_TRUE(torch::equal(dequantize(on_gpu, out).cpu(), dequantize(q, out)));
      }
    }
  }
}

TEST(GpuQuant, QuantizedLinearOnTheGpuEqualsTheCpu) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(1);
  const auto w = torch::randn({256, 512}) * 0.05;
  const auto q = quantize(w, QuantKind::nf4);
  const auto gpu = q->to(torch::Device(torch::kCUDA, 0));
  const auto x = torch::randn({8, 512});
  const auto y = quantized_linear(x.cuda(), *gpu, torch::Tensor()).cpu();
  EXPECT_TRUE(torch::allclose(y, quantized_linear(x, *q, torch::Tensor()), 1e-5, 1e-5));
}

}  // namespace
}  // namespace trainer::nn::quant
