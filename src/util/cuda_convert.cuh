// Conversions between float and the dtypes CUDA kernels read and write (float, bfloat16, half),
// for the .cu files (no torch header): to_float(v), from_float<T>(v).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace trainer::cuda {

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half(v);
}

}  // namespace trainer::cuda
