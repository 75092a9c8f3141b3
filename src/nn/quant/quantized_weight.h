// A frozen linear weight held quantized (QLoRA's base, model.lora.base_quant) and the product
// with it, as bitsandbytes 0.50 computes them on the CPU:
//   nf4   Linear4bit: the forward dequantizes the weight into the input's dtype and multiplies
//         (bitsandbytes' gemm_4bit, default path); the backward multiplies the output's gradient
//         by the weight dequantized into its quantized dtype, cast to the gradient's
//         (MatMul4Bit.backward).
//   int8  Linear8bitLt while training on the CPU (MatMul8bitFp): forward and backward multiply by
//         CB cast to the input's dtype times SCB / 127 (int8.h's dequantize_for_matmul), the
//         gradient cast to the input's dtype first.
// Under autocast the input's dtype is autocast's. Neither product keeps a dequantized weight
// between forward and backward: the backward dequantizes again, so a model's forward holds its
// quantized bytes and one layer's dequantized weight at a time.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trainer::nn::quant {

enum class QuantKind { none, nf4, int8 };

// The kind a model.lora.base_quant names: none, nf4 or int8. Throws std::invalid_argument on
// another name.
QuantKind quant_kind(const std::string& name);

class QuantizedWeight {
 public:
  virtual ~QuantizedWeight() = default;
  // The weight [out, in] that the forward multiplies an input of dtype `compute` by.
  virtual torch::Tensor for_forward(torch::ScalarType compute) const = 0;
  // The weight [out, in] that the backward multiplies a gradient of dtype `grad` by, for an input
  // of dtype `input`.
  virtual torch::Tensor for_backward(torch::ScalarType grad, torch::ScalarType input) const = 0;
  // The dequantized weight in `out` (what merging adapters into it starts from: PEFT's
  // dequantize_bnb_weight).
  virtual torch::Tensor dequantized(torch::ScalarType out) const = 0;
  // Every tensor it holds (the NF4 and dynamic tables are one tensor per device, shared by every
  // weight on it: count by storage).
  virtual std::vector<torch::Tensor> tensors() const = 0;
  // The same weight with its tensors on `device`.
  virtual std::shared_ptr<QuantizedWeight> to(const torch::Device& device) const = 0;
  // The weight's shape and the dtype it had when quantized.
  virtual std::vector<int64_t> shape() const = 0;
  virtual torch::ScalarType dtype() const = 0;
};

// `w` (a linear layer's [out, in] weight: float32, bfloat16 or float16, finite) quantized as
// `kind` (not none): nf4 in blocks of 64 with double quantization (quantize_nf4's defaults, as
// BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
// bnb_4bit_use_double_quant=True)), int8 as Int8Params. Throws std::invalid_argument on other
// input.
std::shared_ptr<QuantizedWeight> quantize(const torch::Tensor& w, QuantKind kind);

struct Nf4Weight;

// A weight held as given in NF4 (e.g. as a folder saved it: nf4.h's nf4_from_saved).
std::shared_ptr<QuantizedWeight> quantized(Nf4Weight w);

// x [..., in] -> x W^T + bias [..., out] with W the quantized weight (no gradient for it or for
// the bias: both frozen). `w` must outlive the backward pass through the result.
torch::Tensor quantized_linear(const torch::Tensor& x, const QuantizedWeight& w,
                               const torch::Tensor& bias);

// Bytes held by the tensors of `weights`, each storage counted once.
int64_t held_bytes(const std::vector<const QuantizedWeight*>& weights);

// The bytes quantize() of a weight of `shape` as `kind` holds, counted from the layout without
// quantizing (a planned model's memory): nf4, the packed codes (two a byte), an absmax code a
// block of 64, a float32 absmax a block of 256 of those and the float32 offset; int8, a byte an
// element and a float32 scale a row. The tables every weight on a device shares (nf4's 16 codes
// and the 256 codes of its absmax) are shared_table_bytes(kind), once per device.
int64_t planned_bytes(const std::vector<int64_t>& shape, QuantKind kind);
int64_t shared_table_bytes(QuantKind kind);

}  // namespace trainer::nn::quant
