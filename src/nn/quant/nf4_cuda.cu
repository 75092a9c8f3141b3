// The NF4 dequantization kernel (nn/quant/nf4_kernel.h).
#include <cuda_runtime.h>

#include "nn/fused/fused_dispatch.cuh"
#include "nn/quant/nf4_kernel.h"
#include "util/cuda_convert.cuh"

namespace trainer::nn::quant {
namespace {

constexpr int kThreads = 256;

// The float32 absmax of block b, as restore_absmax computes it (a product, then a sum).
__device__ __forceinline__ float block_absmax(const Nf4DequantizeArgs& a, int64_t b) {
  if (!a.absmax_q) return a.absmax[b];
  const float scaled = __fmul_rn(a.nested_code[a.absmax_q[b]], a.nested_absmax[b / a.nested_blocksize]);
  return __fadd_rn(scaled, *a.offset);
}

// One thread a byte: its two values.
template <class T>
__global__ void __launch_bounds__(kThreads) dequantize(Nf4DequantizeArgs a) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t first = 2 * j;
  if (first >= a.numel) return;
  const uint8_t byte = a.packed[j];
  T* out = static_cast<T*>(a.out);
  out[first] = cuda::from_float<T>(__fmul_rn(a.code[byte >> 4], block_absmax(a, first / a.blocksize)));
  if (first + 1 < a.numel) {
    const int64_t i = first + 1;
    out[i] = cuda::from_float<T>(__fmul_rn(a.code[byte & 15], block_absmax(a, i / a.blocksize)));
  }
}

}  // namespace

const char* launch_nf4_dequantize(const Nf4DequantizeArgs& a, void* stream) {
  if (a.numel == 0) return "";
  const int64_t bytes = (a.numel + 1) / 2;
  const auto blocks = static_cast<unsigned>((bytes + kThreads - 1) / kThreads);
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_elementwise(a.dtype, [&](auto t) {
    dequantize<decltype(t)><<<blocks, kThreads, 0, s>>>(a);
  });
}

}  // namespace trainer::nn::quant
