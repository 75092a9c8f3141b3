// The product with a quantized weight (nn/quant/quantized_weight.h) and a LoRA layer over a
// quantized base (model.lora.base_quant): forward and gradients equal PyTorch's autograd through
// the dequantized weight, as bitsandbytes computes them; the held bytes are the tensors' own.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "nn/lora.h"
#include "nn/quant/int8.h"
#include "nn/quant/nf4.h"
#include "nn/quant/quantized_weight.h"

namespace trainer::nn::quant {
namespace {

torch::Tensor weight(int64_t out, int64_t in, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn({out, in}) * 0.05;  // [out, in]
}

// x W^T + b and the gradient of sum(y * g) for x, through PyTorch's autograd over `w` (dense).
std::pair<torch::Tensor, torch::Tensor> dense(const torch::Tensor& x, const torch::Tensor& w,
                                              const torch::Tensor& b, const torch::Tensor& g) {
  auto xi = x.detach().clone().requires_grad_(true);
  auto y = torch::linear(xi, w, b);
  (y * g).sum().backward();
  return {y.detach(), xi.grad()};
}

std::pair<torch::Tensor, torch::Tensor> quantized(const torch::Tensor& x, const QuantizedWeight& w,
                                                  const torch::Tensor& b, const torch::Tensor& g) {
  auto xi = x.detach().clone().requires_grad_(true);
  auto y = quantized_linear(xi, w, b);
  (y * g.to(y.scalar_type())).sum().backward();
  return {y.detach(), xi.grad()};
}

TEST(QuantizedLinear, Nf4ForwardAndBackwardAreThoseOfTheDequantizedWeight) {
  const auto w = weight(96, 128, 1);
  const auto q = quantize(w, QuantKind::nf4);
  const auto b = torch::randn({96});
  const auto x = torch::randn({3, 5, 128});
  const auto g = torch::randn({3, 5, 96});
  const auto [y, gx] = quantized(x, *q, b, g);
  // bitsandbytes: the forward's weight dequantized into the input's dtype, the backward's into
  // the quantized dtype (float32 here) cast to the gradient's.
  const auto [y_ref, gx_ref] = dense(x, dequantize(quantize_nf4(w), torch::kFloat), b, g);
  EXPECT_TRUE(torch::equal(y, y_ref));
  EXPECT_TRUE(torch::allclose(gx, gx_ref, 1e-6, 1e-7));
  // It is the quantized weight, not the original one.
  EXPECT_GT((y - torch::linear(x, w, b)).abs().max().item<float>(), 1e-4);
}

TEST(QuantizedLinear, Nf4InBfloat16MultipliesInBfloat16) {
  const auto w = weight(64, 128, 2).to(torch::kBFloat16);
  const auto q = quantize(w, QuantKind::nf4);
  const auto x = torch::randn({4, 128}).to(torch::kBFloat16);
  const auto g = torch::randn({4, 64}).to(torch::kBFloat16);
  const auto [y, gx] = quantized(x, *q, torch::Tensor(), g);
  const auto deq = dequantize(quantize_nf4(w), torch::kBFloat16);
  const auto [y_ref, gx_ref] = dense(x, deq, torch::Tensor(), g);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(y, y_ref));
  EXPECT_TRUE(torch::equal(gx, gx_ref));
}

TEST(QuantizedLinear, Int8MultipliesByTheCodesTimesTheScales) {
  const auto w = weight(64, 192, 3);
  const auto q = quantize(w, QuantKind::int8);
  const auto b = torch::randn({64});
  const auto x = torch::randn({6, 192});
  const auto g = torch::randn({6, 64});
  const auto [y, gx] = quantized(x, *q, b, g);
  const auto [y_ref, gx_ref] =
      dense(x, dequantize_for_matmul(quantize_int8(w), torch::kFloat), b, g);
  EXPECT_TRUE(torch::equal(y, y_ref));
  EXPECT_TRUE(torch::allclose(gx, gx_ref, 1e-6, 1e-7));
}

TEST(QuantizedLinear, HeldBytesCountTheSharedTablesOnce) {
  const auto a = quantize(weight(128, 128, 4), QuantKind::nf4);
  const auto b = quantize(weight(256, 128, 5), QuantKind::nf4);
  int64_t each = 0, tables = 0;
  for (const auto* w : {a.get(), b.get()}) {
    for (const auto& t : w->tensors()) each += static_cast<int64_t>(t.nbytes());
  }
  tables = (nf4_code().numel() + dynamic_code().numel()) * 4;
  EXPECT_EQ(held_bytes({a.get(), b.get()}), each - tables);
  const int64_t params = 128 * 128 + 256 * 128;
  // packed codes, one absmax byte per 64 values, the nested absmax and offsets, the tables once
  const int64_t nested = (256 + 255) / 256 * 4 + 4 + (512 + 255) / 256 * 4 + 4;  // [+ offset]
  const int64_t expected = params / 2 + params / 64 + nested + tables;
  EXPECT_EQ(held_bytes({a.get(), b.get()}), expected);
  EXPECT_THROW(quant_kind("fp4"), std::invalid_argument);
}

// A planned model counts its quantized layers from their shapes: the count equals the bytes a
// real quantization holds, for shapes whose blocks and nested blocks do not divide evenly.
TEST(QuantizedLinear, PlannedBytesEqualTheQuantizedWeightsOwn) {
  for (const auto kind : {QuantKind::nf4, QuantKind::int8}) {
    for (const auto& shape :
         std::vector<std::vector<int64_t>>{{128, 128}, {3, 77}, {300, 1000}, {1, 63}, {129, 257}}) {
      const auto q = quantize(weight(shape[0], shape[1], 6), kind);
      EXPECT_EQ(planned_bytes(shape, kind) + shared_table_bytes(kind), held_bytes({q.get()}))
          << shape[0] << "x" << shape[1] << (kind == QuantKind::nf4 ? " nf4" : " int8");
    }
  }
  EXPECT_EQ(planned_bytes({64, 64}, QuantKind::none), 0);
}

TEST(QuantizedLinear, ALoraLayerOverAQuantizedBaseTrainsItsAdapters) {
  nn::Linear layer(torch::nn::LinearOptions(128, 64));
  const auto w = layer->weight.detach().clone();
  const auto b = layer->bias.detach().clone();
  layer->add_adapter(nn::LoraOptions{});
  {
    torch::NoGradGuard no_grad;
    layer->lora_B->weight.normal_(0.0, 0.1);  // a trained adapter's update is not zero
  }
  layer->weight.requires_grad_(false);
  layer->bias.requires_grad_(false);
  layer->quantize_weight(QuantKind::nf4);
  EXPECT_EQ(layer->weight.numel(), 0);
  ASSERT_NE(layer->quantized(), nullptr);
  const auto x = torch::randn({2, 128});
  const auto y = layer->forward(x);
  const auto deq = dequantize(quantize_nf4(w), torch::kFloat);
  const auto h = torch::linear(x, layer->lora_A->weight.detach());
  const auto y_ref = torch::linear(x, deq, b) + torch::linear(h, layer->lora_B->weight.detach()) *
                                                    layer->adapter_options().scaling();
  EXPECT_TRUE(torch::allclose(y, y_ref, 1e-6, 1e-6));
  y.sum().backward();
  EXPECT_TRUE(layer->lora_A->weight.grad().defined());
  EXPECT_TRUE(layer->lora_B->weight.grad().defined());
  torch::nn::Module model;  // the layer as a model's module
  model.register_module("layer", layer);
  EXPECT_EQ(nn::quantized_bytes(model), held_bytes({layer->quantized()}));
  EXPECT_EQ(nn::quantized_parameters(model), 128 * 64);
  EXPECT_THROW(layer->quantize_weight(QuantKind::nf4), std::logic_error);
}

}  // namespace
}  // namespace trainer::nn::quant
