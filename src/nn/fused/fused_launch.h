// What the autograd functions over nn/fused*.cu's kernels share: whether this build has the
// kernels, the launch of one on a tensor's device and current stream, and the element types.
// Included only by nn/fused*.cpp, which CMake compiles with TRAINER_WITH_CUDA in a build with the
// kernels.
#pragma once

#include <torch/types.h>

#include <stdexcept>
#include <string>

#include "nn/fused/fused_kernel.h"

#ifdef TRAINER_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainer::nn {

#ifdef TRAINER_WITH_CUDA
inline constexpr bool kFusedKernelsBuilt = true;

// Runs `launch(args, stream)` on x's device's current stream; throws naming `what` on an error.
template <class Args>
void run_kernel(const char* (*launch)(const Args&, void*), const Args& args, const torch::Tensor& x,
                const char* what) {
  const c10::cuda::CUDAGuard guard(x.device());
  const auto stream = c10::cuda::getCurrentCUDAStream(x.device().index());
  const std::string error = launch(args, stream.stream());
  if (!error.empty())
    throw std::runtime_error(std::string(what) + ": the CUDA kernel failed: " + error);
}
#else
inline constexpr bool kFusedKernelsBuilt = false;

template <class Args>
void run_kernel(const char* (*)(const Args&, void*), const Args&, const torch::Tensor&,
                const char* what) {
  throw std::logic_error(std::string(what) + ": built without the CUDA kernels");
}
#endif

// The element types the kernels take.
inline bool kernel_dtype(torch::ScalarType t) {
  return t == torch::kFloat || t == torch::kBFloat16 || t == torch::kHalf;
}

inline FusedDtype fused_dtype_of(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kBFloat16:
      return FusedDtype::bfloat16;
    case torch::kHalf:
      return FusedDtype::float16;
    default:
      return FusedDtype::float32;
  }
}

}  // namespace trainer::nn
