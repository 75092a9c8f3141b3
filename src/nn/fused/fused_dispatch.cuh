// The dtype dispatch the fused kernels' files (nn/fused*.cu) share: each calls a launch with
// values of the element types its FusedDtype names and returns the launch's CUDA error ("" when
// none). nvcc only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "nn/fused/fused_kernel.h"

namespace trainer::nn {

// The launch's error, "" when none.
inline const char* last_launch_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : cudaGetErrorString(e);
}

// Calls f(T{}, W{}) for the supported pairs of an element type and a second operand's type (a
// norm's weight, the rotary tables): equal, or the second float32.
template <class F>
const char* dispatch_pair(FusedDtype dtype, FusedDtype second, F&& f) {
  const bool f32 = second == FusedDtype::float32;
  if (!f32 && second != dtype) return "unsupported dtype of the weight or table";
  switch (dtype) {
    case FusedDtype::float32:
      f(float{}, float{});
      break;
    case FusedDtype::bfloat16:
      f32 ? f(__nv_bfloat16{}, float{}) : f(__nv_bfloat16{}, __nv_bfloat16{});
      break;
    case FusedDtype::float16:
      f32 ? f(__half{}, float{}) : f(__half{}, __half{});
      break;
  }
  return last_launch_error();
}

// Calls f(T{}) for the element type.
template <class F>
const char* dispatch_elementwise(FusedDtype dtype, F&& f) {
  switch (dtype) {
    case FusedDtype::float32:
      f(float{});
      break;
    case FusedDtype::bfloat16:
      f(__nv_bfloat16{});
      break;
    case FusedDtype::float16:
      f(__half{});
      break;
  }
  return last_launch_error();
}

}  // namespace trainer::nn
