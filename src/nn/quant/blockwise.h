// bitsandbytes' 8-bit blockwise quantization as its CPU kernel computes it (csrc/cpu_ops.cpp,
// quantize_cpu_impl and dequantizeBlockwise8bitCpu in 0.50), for the double quantization of NF4's
// absmax (nn/quant/nf4.h says the arithmetic), and the per-block scaling both dequantizations
// share. Torch operations on the inputs' device.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>

namespace trainer::nn::quant {

// `a` (float32, any shape, read flat, finite) in blocks of `blocksize` against `code` (256
// ascending float32 values in [-1, 1]): the uint8 codes [numel] and each block's float32 absmax.
std::pair<torch::Tensor, torch::Tensor> quantize_blockwise_8bit(const torch::Tensor& a,
                                                                const torch::Tensor& code,
                                                                int64_t blocksize);

// code[q] * absmax of q's block, float32 [numel of q].
torch::Tensor dequantize_blockwise_8bit(const torch::Tensor& q, const torch::Tensor& absmax,
                                        const torch::Tensor& code, int64_t blocksize);

// values [n] (float32, flat, contiguous) multiplied in place by the absmax of each one's block
// (absmax [>= ceil(n / blocksize)], the first for values[0]'s block); returns `values`.
torch::Tensor scale_blocks_(torch::Tensor values, const torch::Tensor& absmax, int64_t blocksize);

}  // namespace trainer::nn::quant
