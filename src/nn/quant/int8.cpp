#include "nn/quant/int8.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace trainer::nn::quant {
namespace {

// Python's 1.0 / 127.0 (and the literal 7.874015718698502e-3), which ATen rounds to float32 when
// it multiplies a float32 tensor by it.
constexpr double kInv127 = 1.0 / 127.0;

void check_input(const torch::Tensor& w) {
  if (!w.defined() || w.numel() == 0 || w.dim() == 0)
    throw std::invalid_argument("int8 quantization of an empty or 0-dim tensor");
  const auto t = w.scalar_type();
  if (t != torch::kFloat && t != torch::kBFloat16 && t != torch::kHalf)
    throw std::invalid_argument(
        std::string("int8 quantization needs a float32, bfloat16 or float16 tensor, not ") +
        c10::toString(t));
}

}  // namespace

int64_t Int8Weight::held_bytes() const {
  return static_cast<int64_t>(cb.nbytes() + scb.nbytes());
}

Int8Weight Int8Weight::to(const torch::Device& device) const {
  Int8Weight w = *this;
  w.cb = cb.to(device);
  w.scb = scb.to(device);
  return w;
}

Int8Weight quantize_int8(const torch::Tensor& w) {
  check_input(w);
  const torch::Tensor a = w.to(torch::kHalf).reshape({w.size(0), -1});
  if (!torch::isfinite(a).all().item<bool>())
    throw std::invalid_argument(
        "int8 quantization of a tensor holding inf, NaN or values beyond float16's range");
  Int8Weight out;
  out.scb = std::get<0>(a.abs().max(1)).to(torch::kFloat);
  // A zero row's scale is inf and its products NaN: its codes are 0, as bitsandbytes' conversion
  // of NaN to int8 gives on x86.
  out.cb = torch::round(a * out.scb.reciprocal().mul(127.0).unsqueeze(-1))
               .masked_fill_(out.scb.eq(0).unsqueeze(-1), 0)
               .to(torch::kChar);
  out.shape = w.sizes().vec();
  out.dtype = w.scalar_type();
  return out;
}

torch::Tensor dequantize(const Int8Weight& w, torch::ScalarType out) {
  return (w.cb * w.scb.view({-1, 1}) * kInv127).to(out).view(w.shape);
}

torch::Tensor dequantize_for_matmul(const Int8Weight& w, torch::ScalarType compute) {
  return w.cb.to(compute).mul_(w.scb.unsqueeze(1).mul(kInv127)).view(w.shape);
}

}  // namespace trainer::nn::quant
