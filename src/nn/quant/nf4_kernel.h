// The NF4 dequantization kernel (nn/quant/nf4_cuda.cu): nf4.h's dequantize on a CUDA device in
// one launch, with the same float32 arithmetic (each product and sum rounded as ATen's operators
// round them, no fused multiply-add) and one rounding to the output dtype. No torch header: the
// kernel's file is compiled by nvcc alone; nn/quant/nf4.cpp calls it for CUDA weights. Every
// pointer is device memory; the launch goes on CUDA stream `stream` (a cudaStream_t) and returns
// the CUDA error of the launch ("" when none).
#pragma once

#include <cstdint>

#include "nn/fused/fused_kernel.h"

namespace trainer::nn::quant {

// w[i] = code[c_i] * absmax[i / blocksize], c_i the i-th 4-bit code of `packed` (element 2j in
// byte j's high nibble, 2j + 1 in its low one); with `nested_absmax`, absmax[b] =
// nested_code[absmax_q[b]] * nested_absmax[b / nested_blocksize] + *offset (float32).
struct Nf4DequantizeArgs {
  const uint8_t* packed = nullptr;       // [(numel + 1) / 2]
  const float* absmax = nullptr;         // [blocks] float32 (not nested)
  const uint8_t* absmax_q = nullptr;     // [blocks] 8-bit codes (nested)
  const float* nested_absmax = nullptr;  // [ceil(blocks / nested_blocksize)] (nested)
  const float* nested_code = nullptr;    // [256] (nested)
  const float* offset = nullptr;         // one float32 (nested)
  const float* code = nullptr;           // [16], the NF4 table
  void* out = nullptr;                   // [numel] of `dtype`
  int64_t numel = 0, blocksize = 64, nested_blocksize = 256;
  FusedDtype dtype = FusedDtype::float32;
};

const char* launch_nf4_dequantize(const Nf4DequantizeArgs& args, void* stream);

}  // namespace trainer::nn::quant
