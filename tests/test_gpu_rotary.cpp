// The fused rotary-embedding kernel (nn/fused/fused_rotary_ops.h) against the ATen composition the
// llama model uses without it, transformers' apply_rotary_pos_emb (q * cos + rotate_half(q) * sin,
// cos and sin cast to the hidden states' dtype): outputs and gradients of q and k, float32 /
// bfloat16 / float16 with float32 tables (autocast's mix) and tables of q's dtype, odd and grouped
// head counts, one token, a start offset, packed positions, q and k read as strided views of one
// projection's output. Then the llama model with model.fused_kernels auto against off. The
// support check runs everywhere; everything else skips when no GPU is visible.
//
// Tolerances: the kernel rounds each product and sum where ATen's composition and autograd round
// them (products in the output's dtype, then their sum; gradients cast to q's dtype before they
// are added), so it agrees with the reference to the last bit in practice; the bound allowed is
// that of tests/test_gpu_kernels.cpp, elementwise 1e-5 for float32 and 2^-7 (two bfloat16 units
// in the last place) for bfloat16 and float16, relative to the element and the tensor's largest
// one. The model comparisons differ by the RMSNorm and SwiGLU kernels as well: within 1e-5 in
// norm in float32 and 2e-2 under bfloat16 autocast (bfloat16 matmuls between the kernels).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <unordered_set>
#include <vector>

#include "gpu_kernel_checks.h"
#include "llama_fixture.h"
#include "models/llama_layers.h"
#include "models/model.h"
#include "nn/autocast.h"
#include "nn/fused/fused_ops.h"
#include "nn/fused/fused_rotary_ops.h"

namespace trainer::nn {
namespace {

using test_support::expect_close;
using test_support::expect_close_norm;
using test_support::graph_has;
using test_support::tolerance;

// The tables of `rows` positions for head width hd: the default rope's angles p * theta^(-2i/hd)
// in float32, their cos and sin [rows, hd / 2].
RotaryTables tables_of(int64_t rows, int64_t hd, const torch::Device& device) {
  const auto exponents = torch::arange(0, hd, 2, torch::kLong).to(torch::kFloat) / double(hd);
  const auto inv_freq = torch::pow(10000.0, exponents).reciprocal().to(device);
  const auto angles = torch::outer(torch::arange(rows, inv_freq.options()), inv_freq);
  RotaryTables r;
  r.cos = angles.cos();
  r.sin = angles.sin();
  return r;
}

// transformers' rotate_half: [-x2, x1].
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// transformers' apply_rotary_pos_emb for x [B, T, H, hd]: the tokens' rows of the tables, repeated
// to hd columns, cast to r.dtype, a head dimension inserted; x * cos + rotate_half(x) * sin.
torch::Tensor reference_rotate(const torch::Tensor& x, const RotaryTables& r) {
  const int64_t B = x.size(0), T = x.size(1);
  auto rows = [&](const torch::Tensor& table) {  // [B or 1, T, hd]
    const auto picked = r.positions.defined()
                            ? table.index_select(0, r.positions.flatten()).view({B, T, -1})
                            : table.narrow(0, r.start, T).unsqueeze(0);
    return torch::cat({picked, picked}, -1).to(r.dtype).unsqueeze(2);
  };
  return x * rows(r.cos) + rotate_half(x) * rows(r.sin);
}

// Positions of packed rows [B, T]: documents of random lengths (1..7), each counted from 0.
torch::Tensor packed_positions(int64_t B, int64_t T) {
  std::vector<int64_t> out;
  for (int64_t b = 0; b < B; ++b) {
    int64_t left = 0, pos = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (left == 0) {
        left = torch::randint(1, 8, {1}).item<int64_t>();
        pos = 0;
      }
      out.push_back(pos++);
      --left;
    }
  }
  return torch::tensor(out, torch::kLong).view({B, T});
}

struct Case {
  int64_t B, T, q_heads, k_heads, hd;
  bool packed = false;
  int64_t start = 0;
};

// q, k (and v's space) as one projection's output [B, T, (Hq + 2 Hk) * hd] of `dtype`: q and k
// views into it, strided over tokens.
std::pair<torch::Tensor, torch::Tensor> projected(const Case& c, torch::ScalarType dtype,
                                                  const torch::Device& device) {
  const int64_t q_width = c.q_heads * c.hd, k_width = c.k_heads * c.hd;
  const auto qkv = torch::randn({c.B, c.T, q_width + 2 * k_width}, device).to(dtype);
  return {qkv.narrow(-1, 0, q_width).view({c.B, c.T, c.q_heads, c.hd}),
          qkv.narrow(-1, q_width, k_width).view({c.B, c.T, c.k_heads, c.hd})};
}

// One case in one (q dtype, table dtype): outputs and gradients against the reference, gradients
// arriving as sdpa's would (transposed views).
void check_case(const Case& c, torch::ScalarType dtype, torch::ScalarType table_dtype) {
  const torch::Device cuda(torch::kCUDA, 0);
  auto r = tables_of(c.start + c.T + 3, c.hd, cuda);
  r.start = c.start;
  r.dtype = table_dtype;
  if (c.packed) r.positions = packed_positions(c.B, c.T).to(cuda);
  const auto [q0, k0] = projected(c, dtype, cuda);
  ASSERT_TRUE(fused_rotary_supports(q0, k0, r));

  auto q_ref = q0.detach().clone().requires_grad_(true);
  auto k_ref = k0.detach().clone().requires_grad_(true);
  const auto qr_ref = reference_rotate(q_ref, r), kr_ref = reference_rotate(k_ref, r);
  const auto out_type = qr_ref.scalar_type();
  const auto grad_q = torch::randn({c.B, c.q_heads, c.T, c.hd}, cuda).to(out_type).transpose(1, 2);
  const auto grad_k = torch::randn({c.B, c.k_heads, c.T, c.hd}, cuda).to(out_type).transpose(1, 2);
  torch::autograd::backward({qr_ref, kr_ref}, {grad_q, grad_k});

  auto q = q0.detach().requires_grad_(true), k = k0.detach().requires_grad_(true);  // strided
  const auto [qr, kr] = fused_rotary(q, k, r);
  torch::autograd::backward({qr, kr}, {grad_q, grad_k});
  EXPECT_TRUE(qr.is_contiguous() && kr.is_contiguous());
  const double tol = tolerance(dtype);
  expect_close("q rotated", qr, qr_ref, tol);
  expect_close("k rotated", kr, kr_ref, tol);
  expect_close("grad q", q.grad(), q_ref.grad(), tol);
  expect_close("grad k", k.grad(), k_ref.grad(), tol);
}

TEST(GpuRotary, MatchesTheATenComposition) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  const std::vector<Case> cases = {
      {1, 1, 1, 1, 2},                          // one token, one pair
      {2, 7, 5, 1, 12},                         // odd query heads sharing one key/value head
      {3, 33, 6, 2, 64, /*packed=*/true},       // packed documents, grouped heads
      {2, 130, 3, 3, 128, false, /*start=*/9},  // decoding after 9 cached positions
      {1, 1, 7, 7, 80, /*packed=*/true},        // one packed token
      {4, 257, 14, 2, 64},                      // more heads than a block's threads
      {2, 40000, 1, 1, 4}};                     // more tokens than the grid's blocks
  const std::vector<std::pair<torch::ScalarType, torch::ScalarType>> dtypes = {
      {torch::kFloat, torch::kFloat},
      {torch::kBFloat16, torch::kFloat},
      {torch::kBFloat16, torch::kBFloat16},
      {torch::kHalf, torch::kFloat},
      {torch::kHalf, torch::kHalf}};
  for (const auto& c : cases) {
    for (const auto& [dtype, table_dtype] : dtypes) {
      SCOPED_TRACE(testing::Message()
                   << "B " << c.B << " T " << c.T << " heads " << c.q_heads << "/" << c.k_heads
                   << " hd " << c.hd << " packed " << c.packed << " start " << c.start << " "
                   << dtype << " tables " << table_dtype);
      check_case(c, dtype, table_dtype);
    }
  }
}

// Gradients reaching only one of the rotated tensors: the other's input gets zeros.
TEST(GpuRotary, OneOutputUsed) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(1);
  const torch::Device cuda(torch::kCUDA, 0);
  auto r = tables_of(8, 16, cuda);
  auto q = torch::randn({2, 8, 4, 16}, cuda).requires_grad_(true);
  auto k = torch::randn({2, 8, 2, 16}, cuda).requires_grad_(true);
  auto q_ref = q.detach().clone().requires_grad_(true);
  const auto [qr, kr] = fused_rotary(q, k, r);
  qr.sum().backward();
  reference_rotate(q_ref, r).sum().backward();
  expect_close("grad q", q.grad(), q_ref.grad(), 1e-5);
  EXPECT_EQ(k.grad().abs().max().item<float>(), 0.0f);
}

TEST(GpuRotary, SupportsOnlyWhatTheKernelTakes) {
  auto cpu = tables_of(8, 16, torch::kCPU);
  EXPECT_FALSE(
      fused_rotary_supports(torch::randn({1, 8, 2, 16}), torch::randn({1, 8, 2, 16}), cpu));
  SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  auto r = tables_of(8, 16, cuda);
  const auto q = torch::randn({2, 8, 4, 16}, cuda), k = torch::randn({2, 8, 2, 16}, cuda);
  if (!fused_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  EXPECT_TRUE(fused_rotary_supports(q, k, r));
  EXPECT_FALSE(fused_rotary_supports(q, k, cpu));  // tables elsewhere
  EXPECT_FALSE(fused_rotary_supports(q.to(torch::kDouble), k.to(torch::kDouble), r));
  EXPECT_FALSE(fused_rotary_supports(q, k.to(torch::kBFloat16), r));             // mixed q and k
  EXPECT_FALSE(fused_rotary_supports(q, torch::randn({2, 8, 2, 14}, cuda), r));  // widths
  auto half_tables = r;
  half_tables.dtype = torch::kHalf;  // neither float32 nor q's
  EXPECT_FALSE(fused_rotary_supports(q, k, half_tables));
  auto late = r;
  late.start = 1;  // positions 1..8 past the 8 rows
  EXPECT_FALSE(fused_rotary_supports(q, k, late));
  auto packed = r;
  packed.positions = torch::zeros({2, 7}, torch::TensorOptions(cuda).dtype(torch::kLong));
  EXPECT_FALSE(fused_rotary_supports(q, k, packed));  // not one per token
  packed.positions = torch::zeros({2, 8}, torch::TensorOptions(cuda).dtype(torch::kLong));
  EXPECT_TRUE(fused_rotary_supports(q, k, packed));
}

// The tables' rows the llama attention falls back to where the kernel does not take q and k
// (llama::rope_of(tables, T)) are the model's ATen rotation of the same positions: from a start,
// and packed. Runs on the CPU.
TEST(GpuRotary, FallbackRowsAreTheATenRotation) {
  const int64_t hd = 12, T = 6;
  auto r = tables_of(16, hd, torch::kCPU);
  const auto exponents = torch::arange(0, hd, 2, torch::kLong).to(torch::kFloat) / double(hd);
  const auto inv_freq = torch::pow(10000.0, exponents).reciprocal();
  auto expected = [&](const torch::Tensor& pos) {  // [..., 1, hd] each
    const auto angles = pos.to(torch::kFloat).unsqueeze(-1) * inv_freq;
    return models::llama::rope_of(angles.cos(), angles.sin(), torch::kFloat);
  };
  r.start = 3;
  const auto plain = models::llama::rope_of(r, T), plain_want = expected(torch::arange(3, 3 + T));
  expect_close("cos from start", plain.cos, plain_want.cos, 1e-6);
  expect_close("sin from start", plain.sin, plain_want.sin, 1e-6);
  r.positions = packed_positions(2, T);
  const auto packed = models::llama::rope_of(r, T), packed_want = expected(r.positions);
  expect_close("cos packed", packed.cos, packed_want.cos, 1e-6);
  expect_close("sin packed", packed.sin, packed_want.sin, 1e-6);
}

// The small llama (tests/llama_fixture.h: grouped heads, head_dim 12, llama3 scaling) with
// model.fused_kernels auto against off on CUDA: logits and every parameter's gradient, plain and
// packed rows, in float32 and under bfloat16 autocast; the auto model's graph holds the kernel.
TEST(GpuRotary, LlamaFusedMatchesUnfused) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(2);
  const torch::Device cuda(torch::kCUDA, 0);
  auto cfg = models::test_support::small_llama_config();
  cfg.options.set("qk_norm", true);
  const models::InputSpec input{{models::test_support::kLlamaContext}, 0};
  cfg.options.set("fused_kernels", "off");
  auto plain = models::build_model(cfg, input);
  cfg.options.set("fused_kernels", "auto");
  auto fused = models::build_model(cfg, input);
  plain->to(cuda);
  fused->to(cuda);
  {
    torch::NoGradGuard no_grad;
    const auto from = plain->parameters(), to = fused->parameters();
    // Every weight N(0, 0.1), every norm's around 1: no part of the model close to the identity.
    for (size_t i = 0; i < from.size(); ++i) {
      to[i].copy_(from[i].dim() == 1 ? from[i].uniform_(0.5, 1.5) : from[i].normal_(0.0, 0.1));
    }
  }
  const int64_t B = 3, T = models::test_support::kLlamaContext;
  const auto tokens = torch::randint(models::test_support::kLlamaVocab, {B, T}, torch::kLong);
  const auto positions = packed_positions(B, T);
  for (const bool autocast : {false, true}) {
    for (const bool packed : {false, true}) {
      SCOPED_TRACE(testing::Message() << "autocast " << autocast << " packed " << packed);
      auto run = [&](models::Net& net, bool expect_kernel) {
        net->zero_grad();
        AutocastGuard guard(torch::kCUDA, torch::kBFloat16, autocast);
        const auto ids = tokens.to(cuda);
        const auto logits =
            packed ? net->forward_packed(ids, positions.to(cuda)) : net->forward(ids);  // [B, T, V]
        EXPECT_EQ(graph_has(logits, "RotaryFunction"), expect_kernel);
        logits.to(torch::kFloat).pow(2).mean().backward();
        std::vector<torch::Tensor> out{logits.to(torch::kFloat)};
        for (const auto& p : net->parameters()) out.push_back(p.grad());
        return out;
      };
      const auto got = run(fused, fused_kernels_built()), want = run(plain, false);
      ASSERT_EQ(got.size(), want.size());
      const double tol = autocast ? 2e-2 : 1e-5;
      for (size_t i = 0; i < got.size(); ++i) {
        expect_close_norm("logits, parameter grads #" + std::to_string(i), got[i], want[i], tol);
      }
    }
  }
}

}  // namespace
}  // namespace trainer::nn

namespace trainer::models {
namespace {

// Decoding with the key/value cache on CUDA with model.fused_kernels auto (each step rotated from
// the tables at its start position) gives the forward pass's logits at every position, in
// float32 within 1e-5 of their largest.
TEST(GpuRotary, LlamaFusedDecodingEqualsTheForwardPass) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  torch::manual_seed(3);
  const torch::Device cuda(torch::kCUDA, 0);
  auto cfg = test_support::small_llama_config();
  cfg.options.set("fused_kernels", "auto");
  auto net = build_model(cfg, InputSpec{{test_support::kLlamaContext}, 0});
  net->to(cuda);
  net->eval();
  torch::NoGradGuard no_grad;
  const auto tokens =
      torch::randint(test_support::kLlamaVocab, {2, test_support::kLlamaContext}, torch::kLong)
          .to(cuda);
  const auto full = net->forward(tokens);  // [B, T, V]
  const double tol = 1e-5 * full.abs().max().item<double>();
  auto decoder = model_registry().get("llama").decoder(*net, /*use_cache=*/true);
  auto logits = decoder->next_logits(tokens.slice(1, 0, 5));  // [B, V] after 5 tokens
  EXPECT_LT((logits - full.select(1, 4)).abs().max().item<double>(), tol);
  for (int64_t t = 5; t < test_support::kLlamaContext; ++t) {
    logits = decoder->next_logits(tokens.slice(1, t, t + 1));
    EXPECT_LT((logits - full.select(1, t)).abs().max().item<double>(), tol) << t;
  }
}

}  // namespace
}  // namespace trainer::models
