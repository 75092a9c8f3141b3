// int8 weights as bitsandbytes 0.50's 8-bit base stores them: Linear8bitLt's Int8Params, plain
// per-row absmax int8 (LLM.int8()'s weight side; the outlier decomposition concerns activations
// and is not part of the stored weight). Equal to bitsandbytes bit for bit (tests/quant_check.py,
// Quant.* in tests/test_quant.cpp):
//   - quantization (Int8Params._quantize): the weight is cast to float16 first, then
//     functional.int8_vectorwise_quant: SCB = max |w| of each row (float32),
//     CB = round(w * (reciprocal(SCB) * 127)) as int8, round half to even ("127.0 / SCB" in
//     Python is reciprocal(SCB) * 127, two roundings). A row of zeros has SCB 0 and codes 0
//     (bitsandbytes converts NaN to int8 there, which gives 0 on x86);
//   - dequantize(): functional.int8_vectorwise_dequant, (CB * SCB) * float32(1/127) in float32,
//     what PEFT's dequantize_bnb_weight and merge_and_unload use, then cast to the output dtype;
//   - dequantize_for_matmul(): what Linear8bitLt's forward multiplies by while training on the
//     CPU (autograd MatMul8bitFp): CB cast to the compute dtype, times SCB * float32(1/127),
//     computed in float32 and rounded to the compute dtype.
// Rows are the first dimension: a linear layer's [out, in] weight has one scale per output.
// Torch operations on the weight's device.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace trainer::nn::quant {

struct Int8Weight {
  torch::Tensor cb;                         // int8 [rows, numel / rows]
  torch::Tensor scb;                        // float32 [rows]
  std::vector<int64_t> shape;               // of the weight
  torch::ScalarType dtype = torch::kFloat;  // the weight's dtype when it was quantized

  // Bytes of cb and scb, measured from the tensors.
  int64_t held_bytes() const;
  // The same weight with both tensors on `device`.
  Int8Weight to(const torch::Device& device) const;
};

// `w` (float32, bfloat16 or float16, at least 1-D, finite, |w| within float16's range) as int8
// rows. Throws std::invalid_argument on other input.
Int8Weight quantize_int8(const torch::Tensor& w);

// int8_vectorwise_dequant's weight [shape], cast to `out`.
torch::Tensor dequantize(const Int8Weight& w, torch::ScalarType out);

// MatMul8bitFp's weight [shape] in `compute` (the input's dtype).
torch::Tensor dequantize_for_matmul(const Int8Weight& w, torch::ScalarType compute);

}  // namespace trainer::nn::quant
