// Arithmetic the fused kernels share (the .cu files; no torch header): round_to<T>(v), a float
// rounded as ATen's T tensor would hold it.
#pragma once

#include "util/cuda_convert.cuh"

namespace trainer::cuda {

// v rounded to T (float, bfloat16 or half) and back: the float value ATen's T tensor would hold.
template <class T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

}  // namespace trainer::cuda
