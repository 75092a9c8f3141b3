// The gpt model's fused kernels (nn/fused/fused_gpt_ops.h) against the ATen compositions they
// replace: torch::layer_norm (of x + r for the fused add), and torch::gelu(h + b, "tanh"); outputs
// and gradients, float32 / bfloat16 / float16, with and without a bias, a float32 weight with a
// narrower input (autocast's float32 layer_norm), odd widths (771: no 16-byte loads), one token,
// 50,257 rows, and widths beyond what a block keeps in shared memory. Then the gpt model with
// model.fused_kernels auto against off. The support checks run everywhere; everything else skips
// when no GPU is visible.
//
// Tolerances (those of tests/test_gpu_kernels.cpp): float32 elementwise within 1e-5 of the
// reference, relative to the element and to the tensor's largest one (the reductions' summation
// orders differ); the parameters' gradients, sums over every row, within 1e-5 of the reference's
// norm. bfloat16 / float16 within 2^-7 (two bfloat16 units in the last place): both sides compute
// in float32 and round once where ATen rounds, so a value lands at most a unit away when the
// float32 statistics differ in their last bits. The model comparisons: 1e-5 in norm in float32
// and 2e-2 under bfloat16 autocast (bfloat16 matmuls between the kernels, and c_fc's product
// rounded before its bias is added where ATen's matmul adds it before rounding).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "gpu_kernel_checks.h"
#include "models/model.h"
#include "nn/autocast.h"
#include "nn/fused/fused_gpt_ops.h"
#include "nn/fused/fused_ops.h"

namespace trainer::nn {
namespace {

using test_support::expect_close;
using test_support::expect_close_norm;
using test_support::graph_has;
using test_support::tolerance;

struct NormCase {
  std::vector<int64_t> shape;  // of x; the last is the normalised width
  torch::ScalarType dtype, weight_dtype;
  bool bias;
};

// One token, odd widths, GPT-2's width, 50,257 rows, and 13,001 (beyond the rows kept in shared
// memory and the gradients' sums kept there).
std::vector<NormCase> norm_cases() {
  std::vector<NormCase> cases;
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1, 771}, {3, 5, 768}, {2, 7, 771}, {50257, 24}, {3, 13001}};
  const auto dtypes = test_support::norm_dtypes();
  for (const auto& s : shapes) {
    for (const auto& [x, w] : dtypes) {
      for (const bool bias : {true, false}) cases.push_back({s, x, w, bias});
    }
  }
  return cases;
}

// ATen's layer_norm of s as the fused function's contract has it: with a float32 weight the
// input cast to float32 first (autocast's float32 layer_norm), else in s's dtype.
torch::Tensor reference_layer_norm(const torch::Tensor& s, const torch::Tensor& w,
                                   const torch::Tensor& b) {
  const auto in = w.scalar_type() == torch::kFloat ? s.to(torch::kFloat) : s;
  return torch::layer_norm(in, {s.size(-1)}, w, b, /*eps=*/1e-5);
}

// The parameters of a case, and copies that record gradients: the reference's and the kernel's.
struct NormParams {
  torch::Tensor w_ref, b_ref, w, b;
};

NormParams norm_params(const NormCase& c, const torch::Device& device) {
  const int64_t D = c.shape.back();
  const auto w0 = (torch::rand({D}, device) + 0.5).to(c.weight_dtype);
  const auto b0 = c.bias ? torch::randn({D}, device).to(c.weight_dtype) : torch::Tensor();
  auto grad = [](const torch::Tensor& t) {
    return t.defined() ? t.clone().requires_grad_(true) : t;
  };
  return {grad(w0), grad(b0), grad(w0), grad(b0)};
}

void expect_param_grads(const NormParams& p, double tol) {
  expect_close_norm("grad weight", p.w.grad(), p.w_ref.grad(), tol);
  if (p.b.defined()) expect_close_norm("grad bias", p.b.grad(), p.b_ref.grad(), tol);
}

// What the functions take: CUDA tensors of the kernels' dtypes with parameters that fit.
TEST(GpuKernelsGpt, SupportChecks) {
  const auto x = torch::randn({2, 3, 8}), w = torch::ones({8}), b = torch::zeros({8});
  // The CPU keeps ATen's operators.
  EXPECT_FALSE(fused_layer_norm_supports(x, w, b));
  EXPECT_FALSE(fused_add_layer_norm_supports(x, x, w, b));
  EXPECT_FALSE(fused_bias_gelu_supports(x, b));
  SKIP_WITHOUT_CUDA();
  if (!fused_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  const torch::Device cuda(torch::kCUDA, 0);
  const auto xc = x.to(cuda), wc = w.to(cuda), bc = b.to(cuda);
  EXPECT_TRUE(fused_layer_norm_supports(xc, wc, bc));
  EXPECT_TRUE(fused_layer_norm_supports(xc, wc, {}));
  EXPECT_TRUE(fused_layer_norm_supports(xc.to(torch::kBFloat16), wc, bc));  // autocast's mix
  EXPECT_FALSE(fused_layer_norm_supports(xc, wc.to(torch::kBFloat16), bc));
  EXPECT_FALSE(fused_layer_norm_supports(xc, wc, bc.to(torch::kHalf)));
  EXPECT_FALSE(fused_layer_norm_supports(xc, torch::ones({9}, cuda), {}));
  EXPECT_FALSE(fused_layer_norm_supports(xc.to(torch::kDouble), wc.to(torch::kDouble), {}));
  EXPECT_TRUE(fused_add_layer_norm_supports(xc, xc.to(torch::kBFloat16), wc, bc));
  EXPECT_FALSE(fused_add_layer_norm_supports(xc, xc.narrow(2, 0, 4), wc, bc));
  EXPECT_TRUE(fused_bias_gelu_supports(xc, bc));
  EXPECT_TRUE(fused_bias_gelu_supports(xc.to(torch::kHalf), {}));
  EXPECT_FALSE(fused_bias_gelu_supports(xc.to(torch::kBFloat16), bc));  // the bias's dtype
  EXPECT_FALSE(fused_bias_gelu_supports(xc, torch::zeros({7}, cuda)));
}

TEST(GpuKernelsGpt, LayerNormMatchesATen) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  const torch::Device cuda(torch::kCUDA, 0);
  for (const auto& c : norm_cases()) {
    SCOPED_TRACE(testing::Message() << c.shape << " " << c.dtype << " weight " << c.weight_dtype
                                    << (c.bias ? " with bias" : " without bias"));
    const auto x0 = (torch::randn(c.shape, cuda) * 2 + 0.5).to(c.dtype);
    auto p = norm_params(c, cuda);
    auto x_ref = x0.clone().requires_grad_(true);
    const auto y_ref = reference_layer_norm(x_ref, p.w_ref, p.b_ref);
    const auto grad = torch::randn(y_ref.sizes(), cuda).to(y_ref.scalar_type());
    y_ref.backward(grad);

    ASSERT_TRUE(fused_layer_norm_supports(x0, p.w, p.b));
    auto x = x0.clone().requires_grad_(true);
    const auto y = fused_layer_norm(x, p.w, p.b, 1e-5);
    y.backward(grad);
    const double tol = tolerance(c.dtype);
    expect_close("y", y, y_ref, tol);
    expect_close("grad x", x.grad(), x_ref.grad(), tol);
    expect_param_grads(p, tol);
  }
}

// The residual add and the norm in one kernel against x + r then layer_norm: the sum, the norm
// and the gradients of x, r, the weight and the bias, with gradients reaching both the sum and the
// norm; also the block's mix under autocast (a float32 residual stream, a bfloat16 branch).
TEST(GpuKernelsGpt, AddLayerNormMatchesATen) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(1);
  const torch::Device cuda(torch::kCUDA, 0);
  auto cases = norm_cases();
  cases.push_back({{4, 9, 771}, torch::kFloat, torch::kFloat, true});  // with a bfloat16 residual
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const bool mixed = i + 1 == cases.size();
    const auto r_dtype = mixed ? torch::kBFloat16 : c.dtype;
    SCOPED_TRACE(testing::Message()
                 << c.shape << " " << c.dtype << " weight " << c.weight_dtype << " residual "
                 << r_dtype << (c.bias ? " with bias" : " without bias"));
    const auto x0 = torch::randn(c.shape, cuda).to(c.dtype);
    const auto r0 = (torch::randn(c.shape, cuda) + 1).to(r_dtype);
    auto p = norm_params(c, cuda);
    auto x_ref = x0.clone().requires_grad_(true), r_ref = r0.clone().requires_grad_(true);
    const auto s_ref = x_ref + r_ref;
    const auto y_ref = reference_layer_norm(s_ref, p.w_ref, p.b_ref);
    const auto grad_y = torch::randn(y_ref.sizes(), cuda).to(y_ref.scalar_type());
    const auto grad_s = torch::randn(s_ref.sizes(), cuda).to(s_ref.scalar_type());
    torch::autograd::backward({y_ref, s_ref}, {grad_y, grad_s});

    ASSERT_TRUE(fused_add_layer_norm_supports(x0, r0, p.w, p.b));
    auto x = x0.clone().requires_grad_(true), r = r0.clone().requires_grad_(true);
    const auto [s, y] = fused_add_layer_norm(x, r, p.w, p.b, 1e-5);
    torch::autograd::backward({y, s}, {grad_y, grad_s});
    const double tol = tolerance(c.dtype);
    expect_close("sum", s, s_ref, tol);
    expect_close("y", y, y_ref, tol);
    expect_close("grad x", x.grad(), x_ref.grad(), tol);
    expect_close("grad residual", r.grad(), r_ref.grad(), tolerance(r_dtype));
    expect_param_grads(p, tol);
  }
}

// gelu(h + b, "tanh") in one kernel each way against ATen's add and gelu: the output and the
// gradients of h and of the bias (a sum over every row).
TEST(GpuKernelsGpt, BiasGeluMatchesATen) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(2);
  const torch::Device cuda(torch::kCUDA, 0);
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1, 771}, {3, 5, 3072}, {2, 7, 771}, {50257, 24}, {2, 13001}};
  for (const auto& shape : shapes) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      for (const bool with_bias : {true, false}) {
        SCOPED_TRACE(testing::Message()
                     << shape << " " << dtype << (with_bias ? " with bias" : " without bias"));
        const auto h0 = (torch::randn(shape, cuda) * 3).to(dtype);
        const auto b0 = with_bias ? torch::randn({shape.back()}, cuda).to(dtype) : torch::Tensor();
        const auto grad = torch::randn(shape, cuda).to(dtype);
        auto h_ref = h0.clone().requires_grad_(true);
        auto b_ref = with_bias ? b0.clone().requires_grad_(true) : b0;
        const auto out_ref = torch::gelu(with_bias ? h_ref + b_ref : h_ref, "tanh");
        out_ref.backward(grad);

        ASSERT_TRUE(fused_bias_gelu_supports(h0, b0));
        auto h = h0.clone().requires_grad_(true);
        auto b = with_bias ? b0.clone().requires_grad_(true) : b0;
        const auto out = fused_bias_gelu(h, b);
        out.backward(grad);
        const double tol = tolerance(dtype);
        expect_close("out", out, out_ref, tol);
        expect_close("grad h", h.grad(), h_ref.grad(), tol);
        if (with_bias) expect_close_norm("grad bias", b.grad(), b_ref.grad(), tol);
      }
    }
  }
}

config::ModelConfig gpt_config(const std::string& fused, const std::string& checkpointing) {
  config::ModelConfig cfg = models::default_model_config("gpt");
  cfg.name = "gpt";
  cfg.checkpointing = checkpointing;
  cfg.options.set("n_layer", int64_t{2});
  cfg.options.set("n_head", int64_t{5});
  cfg.options.set("n_embd", int64_t{60});  // widths not multiples of 8 (the MLP's 240 is)
  cfg.options.set("block_size", int64_t{16});
  cfg.options.set("vocab_size", int64_t{53});
  cfg.options.set("dropout", 0.0);
  cfg.options.set("fused_kernels", fused);
  return cfg;
}

// The gpt model with model.fused_kernels auto against off: float32, bfloat16 autocast, and
// autocast under activation checkpointing (every block's forward rerun in backward). The fused
// path's graph holds the kernels' functions (without checkpointing, where the graph is whole).
TEST(GpuKernelsGpt, GptFusedMatchesUnfused) {
  SKIP_WITHOUT_CUDA();
  if (!fused_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  const torch::Device cuda(torch::kCUDA, 0);
  const models::InputSpec input{{16}, /*num_classes=*/0};
  for (const int mode : {0, 1, 2}) {  // float32, autocast, autocast + checkpointing
    SCOPED_TRACE(testing::Message() << "mode " << mode);
    const std::string checkpointing = mode == 2 ? "blocks" : "none";
    torch::manual_seed(3);
    auto plain = models::build_model(gpt_config("off", checkpointing), input);
    auto fused = models::build_model(gpt_config("auto", checkpointing), input);
    plain->to(cuda);
    fused->to(cuda);
    {
      torch::NoGradGuard no_grad;
      const auto from = plain->parameters(), to = fused->parameters();
      ASSERT_EQ(from.size(), to.size());
      for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    }
    const auto tokens = torch::randint(/*high=*/53, {3, 11}, torch::kLong).to(cuda);
    const auto grad = torch::randn({3, 11, 53}, cuda);
    auto run = [&](models::Net& net, bool expect_kernels) {
      net->zero_grad();
      AutocastGuard autocast(torch::kCUDA, torch::kBFloat16, /*enabled=*/mode > 0);
      const auto logits = net->forward(tokens).to(torch::kFloat);
      if (expect_kernels) {
        EXPECT_TRUE(graph_has(logits, "AddLayerNormFunction"));
        EXPECT_TRUE(graph_has(logits, "::LayerNormFunction"));
        EXPECT_TRUE(graph_has(logits, "BiasGeluFunction"));
      }
      logits.backward(grad);
      std::vector<torch::Tensor> out{logits};
      for (const auto& p : net->parameters()) out.push_back(p.grad());
      return out;
    };
    const auto got = run(fused, mode < 2), want = run(plain, false);
    ASSERT_EQ(got.size(), want.size());
    const double tol = mode == 0 ? 1e-5 : 2e-2;
    for (size_t i = 0; i < got.size(); ++i) {
      expect_close_norm("logits, parameter grads #" + std::to_string(i), got[i], want[i], tol);
    }
  }
}

}  // namespace
}  // namespace trainer::nn
