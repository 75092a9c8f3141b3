#include "nn/quant/quantized_weight.h"

#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

#include "nn/autocast.h"
#include "nn/quant/int8.h"
#include "nn/quant/nf4.h"

namespace trainer::nn::quant {
namespace {

// The NF4 and dynamic tables on `device`, one tensor each per device for every weight.
std::pair<torch::Tensor, torch::Tensor> shared_tables(const torch::Device& device) {
  static std::mutex mutex;
  static std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> tables;
  const std::lock_guard<std::mutex> lock(mutex);
  auto& t = tables[device.str()];
  if (!t.first.defined()) t = {nf4_code(device), dynamic_code(device)};
  return t;
}

Nf4Weight with_shared_tables(Nf4Weight w) {
  const auto [code, dynamic] = shared_tables(w.packed.device());
  if (torch::equal(w.code, code)) w.code = code;
  if (w.nested() && torch::equal(w.nested_code, dynamic)) w.nested_code = dynamic;
  return w;
}

class Nf4 final : public QuantizedWeight {
 public:
  explicit Nf4(Nf4Weight w) : w_(with_shared_tables(std::move(w))) {}

  torch::Tensor for_forward(torch::ScalarType compute) const override {
    return dequantize(w_, compute);  // gemm_4bit: dequantize_4bit(..., A.dtype)
  }
  torch::Tensor for_backward(torch::ScalarType grad, torch::ScalarType) const override {
    // dequantize_4bit(B, state).to(grad.dtype): one rounding from float32 when quantized in it.
    if (w_.dtype == torch::kFloat || w_.dtype == grad) return dequantize(w_, grad);
    return dequantize(w_, w_.dtype).to(grad);
  }
  torch::Tensor dequantized(torch::ScalarType out) const override { return dequantize(w_, out); }
  std::vector<torch::Tensor> tensors() const override {
    std::vector<torch::Tensor> out;
    for (const auto* t :
         {&w_.packed, &w_.absmax, &w_.nested_absmax, &w_.nested_code, &w_.offset, &w_.code})
      if (t->defined()) out.push_back(*t);
    return out;
  }
  std::shared_ptr<QuantizedWeight> to(const torch::Device& device) const override {
    return std::make_shared<Nf4>(w_.to(device));
  }
  std::vector<int64_t> shape() const override { return w_.shape; }
  torch::ScalarType dtype() const override { return w_.dtype; }

 private:
  Nf4Weight w_;
};

class Int8 final : public QuantizedWeight {
 public:
  explicit Int8(Int8Weight w) : w_(std::move(w)) {}

  torch::Tensor for_forward(torch::ScalarType compute) const override {
    return dequantize_for_matmul(w_, compute);
  }
  torch::Tensor for_backward(torch::ScalarType, torch::ScalarType input) const override {
    return dequantize_for_matmul(w_, input);  // the gradient is cast to the input's dtype
  }
  torch::Tensor dequantized(torch::ScalarType out) const override { return dequantize(w_, out); }
  std::vector<torch::Tensor> tensors() const override { return {w_.cb, w_.scb}; }
  std::shared_ptr<QuantizedWeight> to(const torch::Device& device) const override {
    return std::make_shared<Int8>(w_.to(device));
  }
  std::vector<int64_t> shape() const override { return w_.shape; }
  torch::ScalarType dtype() const override { return w_.dtype; }

 private:
  Int8Weight w_;
};

// x W^T + bias with W dequantized for the product and dropped: the backward dequantizes again.
struct QuantizedMatmul : public torch::autograd::Function<QuantizedMatmul> {
  // `bias` (frozen, or undefined) passed by address: autograd neither tracks nor needs it.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor* bias_of, const QuantizedWeight* w) {
    const torch::Tensor& bias = *bias_of;
    const auto device = x.device().type();
    const auto compute = autocast_enabled(device) ? autocast_dtype(device) : x.scalar_type();
    ctx->saved_data["weight"] = reinterpret_cast<int64_t>(w);
    ctx->saved_data["compute"] = static_cast<int64_t>(compute);
    return torch::linear(x.to(compute), w->for_forward(compute),
                         bias.defined() ? bias.to(compute) : bias);  // [..., out]
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto* w = reinterpret_cast<const QuantizedWeight*>(ctx->saved_data["weight"].toInt());
    const auto compute = static_cast<torch::ScalarType>(ctx->saved_data["compute"].toInt());
    const auto& g = grads[0];  // [..., out]
    const auto weight = w->for_backward(g.scalar_type(), compute);
    return {torch::matmul(g.to(weight.scalar_type()), weight), torch::Tensor(),
            torch::Tensor()};  // [..., in], none for the bias and the weight
  }
};

}  // namespace

QuantKind quant_kind(const std::string& name) {
  if (name == "none") return QuantKind::none;
  if (name == "nf4") return QuantKind::nf4;
  if (name == "int8") return QuantKind::int8;
  throw std::invalid_argument("'" + name + "' is no quantization: use none, nf4 or int8");
}

std::shared_ptr<QuantizedWeight> quantize(const torch::Tensor& w, QuantKind kind) {
  torch::NoGradGuard no_grad;
  switch (kind) {
    case QuantKind::nf4:
      return std::make_shared<Nf4>(quantize_nf4(w.detach()));
    case QuantKind::int8:
      return std::make_shared<Int8>(quantize_int8(w.detach()));
    case QuantKind::none:
      break;
  }
  throw std::invalid_argument("quantize: no quantization kind given");
}

std::shared_ptr<QuantizedWeight> quantized(Nf4Weight w) {
  return std::make_shared<Nf4>(std::move(w));
}

torch::Tensor quantized_linear(const torch::Tensor& x, const QuantizedWeight& w,
                               const torch::Tensor& bias) {
  TORCH_CHECK(!bias.defined() || !bias.requires_grad(),
              "quantized_linear: the bias of a quantized layer is frozen");
  return QuantizedMatmul::apply(x, &bias, &w);
}

int64_t held_bytes(const std::vector<const QuantizedWeight*>& weights) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto* w : weights) {
    for (const auto& t : w->tensors()) {
      if (seen.insert(t.storage().data()).second) bytes += static_cast<int64_t>(t.nbytes());
    }
  }
  return bytes;
}

int64_t planned_bytes(const std::vector<int64_t>& shape, QuantKind kind) {
  int64_t numel = 1;
  for (const int64_t d : shape) numel *= d;
  if (kind == QuantKind::nf4) {
    const int64_t blocks = (numel + 63) / 64, nested = (blocks + 255) / 256;
    return (numel + 1) / 2 + blocks + 4 * nested + 4;
  }
  if (kind == QuantKind::int8) return numel + 4 * (shape.empty() ? 1 : shape.front());
  return 0;
}

int64_t shared_table_bytes(QuantKind kind) {
  return kind == QuantKind::nf4 ? 4 * (16 + 256) : 0;
}

}  // namespace trainer::nn::quant
