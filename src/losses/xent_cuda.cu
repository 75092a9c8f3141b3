// The fused softmax cross-entropy kernel (losses/xent_kernel.h). One block per row: a first pass
// reads the row once for its maximum, the sum of exponentials (online, as FlashAttention's
// softmax) and the sum of the logits; a second pass, whose reads the L2 cache mostly serves,
// writes the gradient. Each row is read twice and written once in its own dtype: about 6 bytes
// per bfloat16 logit, where log_softmax over a float32 copy with nll_loss moves about 36.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>

#include "losses/xent_kernel.h"
#include "util/cuda_convert.cuh"

namespace trainer::losses {
namespace {

constexpr int kThreads = 512;

using cuda::from_float;
using cuda::to_float;

// (max, sum of exp(x - max)) merged with another such pair.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

// The block's (max, sum of exp(x - max)) and sum of logits, in thread 0's m, s and sum: warp
// shuffles, then the first warp over the warps' results.
__device__ __forceinline__ void warp_reduce(float& m, float& s, float& sum) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, offset);
    merge(m, s, m2, s2);
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
}

__device__ __forceinline__ void block_reduce(float& m, float& s, float& sum) {
  __shared__ float wm[kThreads / 32], ws[kThreads / 32], wsum[kThreads / 32];
  warp_reduce(m, s, sum);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    wm[warp] = m;
    ws[warp] = s;
    wsum[warp] = sum;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < kThreads / 32 ? wm[lane] : -INFINITY;
    s = lane < kThreads / 32 ? ws[lane] : 0.0f;
    sum = lane < kThreads / 32 ? wsum[lane] : 0.0f;
    warp_reduce(m, s, sum);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_xent(const T* __restrict__ logits, T* grad, const int64_t* __restrict__ targets,
                 float* __restrict__ row_loss, int64_t cols, int64_t row_stride, float smoothing) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * row_stride;
  float m = -INFINITY, s = 0.0f, sum = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float v = to_float(x[j]);
    if (v > m) {
      s = s * __expf(m - v) + 1.0f;
      m = v;
    } else {
      s += __expf(v - m);
    }
    sum += v;
  }
  block_reduce(m, s, sum);  // thread 0 holds the row's
  __shared__ float lse_shared;
  if (threadIdx.x == 0) {
    const float lse = m + __logf(s);
    const int64_t t = targets[row];
    const float n = static_cast<float>(cols);
    // A target outside the classes makes the loss NaN (the step is then a bad one).
    row_loss[row] = t < 0 || t >= cols
                        ? NAN
                        : (1.0f - smoothing) * (lse - to_float(x[t])) + smoothing * (lse - sum / n);
    lse_shared = lse;
  }
  __syncthreads();
  if (grad == nullptr) return;
  const float lse = lse_shared;
  const int64_t t = targets[row];
  const float uniform = smoothing / static_cast<float>(cols);
  T* g = grad + row * row_stride;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float p = __expf(to_float(x[j]) - lse);
    g[j] = from_float<T>(p - uniform - (j == t ? 1.0f - smoothing : 0.0f));
  }
}

template <class T>
void launch(const XentArgs& a, cudaStream_t stream) {
  softmax_xent<T><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(
      static_cast<const T*>(a.logits), static_cast<T*>(a.grad), a.targets, a.row_loss, a.cols,
      a.row_stride, a.smoothing);
}

}  // namespace

const char* launch_softmax_xent(const XentArgs& a, void* stream) {
  if (a.rows == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case XentDtype::float32:
      launch<float>(a, s);
      break;
    case XentDtype::bfloat16:
      launch<__nv_bfloat16>(a, s);
      break;
    case XentDtype::float16:
      launch<__half>(a, s);
      break;
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : cudaGetErrorString(e);
}

}  // namespace trainer::losses
