// The fused RMSNorm and SwiGLU kernels (nn/fused/fused_ops.h) against the ATen compositions they
// replace in the llama model: outputs and gradients, float32 / bfloat16 / float16, odd widths,
// one token and a 50,257-row input. Every test skips when no GPU is visible.
//
// Tolerances: float32 elementwise within 1e-5 of the reference (relative to the element and to the
// tensor's largest one: the reductions' summation orders differ); the weight's gradient, a sum over
// every row, within 1e-5 of the reference's norm. bfloat16 / float16 elementwise within 2^-7 (two
// bfloat16 units in the last place): the kernels round once where ATen's composition rounds
// twice (its products in the tensor's dtype before they are summed or added), so a value may land
// one unit away, and the reference's own rounding of long sums (the weight's gradient) differs
// from the kernel's float32 sums by about as much, hence the same bound on the norm there.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "gpu_kernel_checks.h"
#include "models/llama_layers.h"
#include "nn/activation_checkpoint.h"
#include "nn/autocast.h"
#include "nn/fused/fused_ops.h"

namespace trainer::nn {
namespace {

using test_support::expect_close;
using test_support::expect_close_norm;
using test_support::tolerance;

struct Case {
  std::vector<int64_t> shape;  // of x; the last is the normalised width
  torch::ScalarType dtype, weight_dtype;
};

std::vector<Case> norm_cases() {
  std::vector<Case> cases;
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1, 37}, {3, 5, 1000}, {2, 7, 4096}, {50257, 24}, {3, 13001}};
  const auto dtypes = test_support::norm_dtypes();
  for (const auto& s : shapes) {
    for (const auto& [x, w] : dtypes) cases.push_back({s, x, w});
  }
  return cases;
}

// LlamaRmsNorm's own ATen path (fused off) against the kernel, forward and backward.
TEST(GpuKernels, RmsNormMatchesATen) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  const torch::Device cuda(torch::kCUDA, 0);
  const double eps = 1e-6;
  for (const auto& c : norm_cases()) {
    SCOPED_TRACE(testing::Message() << c.shape << " " << c.dtype << " weight " << c.weight_dtype);
    const int64_t D = c.shape.back();
    const auto x0 = (torch::randn(c.shape, cuda) * 2 + 0.5).to(c.dtype);
    const auto w0 = (torch::rand({D}, cuda) + 0.5).to(c.weight_dtype);
    models::llama::LlamaRmsNorm reference(D, eps, /*fused=*/false);
    reference->to(cuda, c.weight_dtype);
    reference->weight.data().copy_(w0);
    auto x_ref = x0.clone().requires_grad_(true);
    const auto y_ref = reference->forward(x_ref);
    const auto grad = torch::randn(y_ref.sizes(), cuda).to(y_ref.scalar_type());
    y_ref.backward(grad);

    ASSERT_TRUE(fused_rms_norm_supports(x0, w0));
    auto x = x0.clone().requires_grad_(true);
    auto w = w0.clone().requires_grad_(true);
    const auto y = fused_rms_norm(x, w, eps);
    y.backward(grad);
    const double tol = tolerance(c.dtype);
    expect_close("y", y, y_ref, tol);
    expect_close("grad x", x.grad(), x_ref.grad(), tol);
    expect_close_norm("grad weight", w.grad(), reference->weight.grad(), tol);
  }
}

// The residual add and the norm in one kernel against x + r then LlamaRmsNorm: the sum, the norm
// and the gradients of x, r and the weight, with gradients reaching both the sum and the norm;
// also autocast's mix (a float32 residual stream, a bfloat16 branch output).
TEST(GpuKernels, AddRmsNormMatchesATen) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(1);
  const torch::Device cuda(torch::kCUDA, 0);
  const double eps = 1e-5;
  auto cases = norm_cases();
  cases.push_back({{4, 9, 1000}, torch::kFloat, torch::kFloat});  // with a bfloat16 residual
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const bool mixed = i + 1 == cases.size();
    const auto r_dtype = mixed ? torch::kBFloat16 : c.dtype;
    SCOPED_TRACE(testing::Message() << c.shape << " " << c.dtype << " weight " << c.weight_dtype
                                    << " residual " << r_dtype);
    const int64_t D = c.shape.back();
    const auto x0 = torch::randn(c.shape, cuda).to(c.dtype);
    const auto r0 = torch::randn(c.shape, cuda).to(r_dtype);
    const auto w0 = (torch::rand({D}, cuda) + 0.5).to(c.weight_dtype);
    models::llama::LlamaRmsNorm reference(D, eps, /*fused=*/false);
    reference->to(cuda, c.weight_dtype);
    reference->weight.data().copy_(w0);
    auto x_ref = x0.clone().requires_grad_(true), r_ref = r0.clone().requires_grad_(true);
    const auto s_ref = x_ref + r_ref;
    const auto y_ref = reference->forward(s_ref);
    const auto grad_y = torch::randn(y_ref.sizes(), cuda).to(y_ref.scalar_type());
    const auto grad_s = torch::randn(s_ref.sizes(), cuda).to(s_ref.scalar_type());
    torch::autograd::backward({y_ref, s_ref}, {grad_y, grad_s});

    ASSERT_TRUE(fused_add_rms_norm_supports(x0, r0, w0));
    auto x = x0.clone().requires_grad_(true), r = r0.clone().requires_grad_(true);
    auto w = w0.clone().requires_grad_(true);
    const auto [s, y] = fused_add_rms_norm(x, r, w, eps);
    torch::autograd::backward({y, s}, {grad_y, grad_s});
    const double tol = tolerance(c.dtype);
    expect_close("sum", s, s_ref, tol);
    expect_close("y", y, y_ref, tol);
    expect_close("grad x", x.grad(), x_ref.grad(), tol);
    expect_close("grad residual", r.grad(), r_ref.grad(), tolerance(r_dtype));
    expect_close_norm("grad weight", w.grad(), reference->weight.grad(), tol);
  }
}

// silu(a) * b in one kernel each way against ATen's silu and mul.
TEST(GpuKernels, SwigluMatchesATen) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(2);
  const torch::Device cuda(torch::kCUDA, 0);
  const std::vector<std::vector<int64_t>> shapes = {{1, 1, 37}, {3, 5, 1001}, {50257, 24}};
  for (const auto& shape : shapes) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      SCOPED_TRACE(testing::Message() << shape << " " << dtype);
      const auto a0 = (torch::randn(shape, cuda) * 3).to(dtype);
      const auto b0 = torch::randn(shape, cuda).to(dtype);
      const auto grad = torch::randn(shape, cuda).to(dtype);
      auto a_ref = a0.clone().requires_grad_(true), b_ref = b0.clone().requires_grad_(true);
      const auto out_ref = torch::silu(a_ref) * b_ref;
      out_ref.backward(grad);

      ASSERT_TRUE(fused_swiglu_supports(a0, b0));
      auto a = a0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
      const auto out = fused_swiglu(a, b);
      out.backward(grad);
      const double tol = tolerance(dtype);
      expect_close("out", out, out_ref, tol);
      expect_close("grad a", a.grad(), a_ref.grad(), tol);
      expect_close("grad b", b.grad(), b_ref.grad(), tol);
    }
  }
}

// A llama block with model.fused_kernels auto against the same block with off: float32, bfloat16
// autocast, and autocast under activation checkpointing (the block's forward rerun in backward).
TEST(GpuKernels, LlamaBlockFusedMatchesUnfused) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(3);
  const torch::Device cuda(torch::kCUDA, 0);
  models::llama::LlamaOptions o;
  o.n_layer = 1;
  o.n_head = 5;
  o.n_kv_head = 1;
  o.n_embd = 60;  // head_dim 12; widths not multiples of 8
  o.intermediate_size = 100;
  o.qk_norm = true;
  o.fused_kernels = "auto";
  models::llama::LlamaBlock fused(o);
  o.fused_kernels = "off";
  models::llama::LlamaBlock plain(o);
  fused->to(cuda);
  plain->to(cuda);
  {
    torch::NoGradGuard no_grad;
    const auto from = plain->parameters(), to = fused->parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  const int64_t B = 2, T = 7, hd = 12;
  const models::llama::Rope rope{torch::randn({T, 1, hd}, cuda), torch::randn({T, 1, hd}, cuda)};
  const auto x0 = torch::randn({B, T, o.n_embd}, cuda);
  const auto grad = torch::randn({B, T, o.n_embd}, cuda);
  for (const int mode : {0, 1, 2}) {  // float32, autocast, autocast + checkpointing
    SCOPED_TRACE(testing::Message() << "mode " << mode);
    auto run = [&](models::llama::LlamaBlock& block) {
      block->zero_grad();
      auto x = x0.clone().requires_grad_(true);
      AutocastGuard autocast(torch::kCUDA, torch::kBFloat16, /*enabled=*/mode > 0);
      auto y = mode == 2 ? checkpoint(
                               *block,
                               [&](const torch::Tensor& in) { return block->forward(in, rope); }, x)
                         : block->forward(x, rope);
      y.to(torch::kFloat).backward(grad);
      std::vector<torch::Tensor> out{y.to(torch::kFloat), x.grad()};
      for (const auto& p : block->parameters()) out.push_back(p.grad());
      return out;
    };
    const auto got = run(fused), want = run(plain);
    ASSERT_EQ(got.size(), want.size());
    const double tol = mode == 0 ? 1e-5 : 2e-2;  // bfloat16 matmuls between the kernels
    for (size_t i = 0; i < got.size(); ++i) {
      expect_close_norm("output, input grad, parameter grads #" + std::to_string(i), got[i],
                        want[i], tol);
    }
  }
}

}  // namespace
}  // namespace trainer::nn
