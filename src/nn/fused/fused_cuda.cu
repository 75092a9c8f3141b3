// The fused RMSNorm and SwiGLU kernels (nn/fused/fused_kernel.h). RMSNorm: one block per row, the
// row read once for its statistics and once more (mostly from L2) for the output; the backward's
// weight gradient accumulates in float32 partial rows, one per block, that the caller sums.
// SwiGLU: one elementwise pass each way. Products are rounded where ATen's operators round them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "nn/fused/fused_dispatch.cuh"
#include "nn/fused/fused_kernel.h"
#include "nn/fused/fused_math.cuh"
#include "util/cuda_convert.cuh"

namespace trainer::nn {
namespace {

constexpr int kMaxThreads = 256;

using cuda::from_float;
using cuda::round_to;
using cuda::to_float;

// The block's sum of v, returned to every thread (blockDim.x a multiple of 32, at most 1024).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  __shared__ float total;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// T: x, residual, sum; W: weight; O: y (float32 with a float32 weight, else T).
template <class T, class W, class O>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_forward(const T* __restrict__ x, const T* __restrict__ residual,
                     const W* __restrict__ weight, T* sum, O* __restrict__ y,
                     float* __restrict__ rstd_out, int64_t cols, float eps) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  float squares = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float v = to_float(x[base + j]);
    if (residual != nullptr) {
      const T s = from_float<T>(v + to_float(residual[base + j]));
      sum[base + j] = s;
      v = to_float(s);
    }
    squares += v * v;
  }
  const float rstd = rsqrtf(block_sum(squares) / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) rstd_out[blockIdx.x] = rstd;
  const T* s = residual != nullptr ? sum : x;  // each thread reads back what it wrote
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float n = round_to<T>(to_float(s[base + j]) * rstd);
    y[base + j] = from_float<O>(to_float(weight[j]) * n);
  }
}

template <class T, class W, class O>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_backward(const O* __restrict__ grad_y, const T* __restrict__ grad_sum,
                      const T* __restrict__ s, const W* __restrict__ weight,
                      const float* __restrict__ rstd_in, T* __restrict__ grad_x,
                      float* __restrict__ grad_weight_partial, int64_t rows, int64_t cols,
                      bool shared_acc) {
  // The weight gradient's sums, in shared memory where the row fits: thread t owns columns
  // t, t + blockDim.x, ... in every row, so no two threads touch one.
  extern __shared__ float shared[];
  float* partial = grad_weight_partial + static_cast<int64_t>(blockIdx.x) * cols;
  float* acc = shared_acc ? shared : partial;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) acc[j] = 0.0f;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * cols;
    const float rstd = rstd_in[row];
    float dot = 0.0f;  // sum over the row of dn * n
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float dy = to_float(grad_y[base + j]);
      const float n = to_float(s[base + j]) * rstd;
      dot += round_to<T>(dy * to_float(weight[j])) * n;
      acc[j] += dy * round_to<T>(n);
    }
    dot = block_sum(dot) * inv_cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float dn = round_to<T>(to_float(grad_y[base + j]) * to_float(weight[j]));
      const float n = to_float(s[base + j]) * rstd;
      float g = rstd * (dn - n * dot);
      if (grad_sum != nullptr) g += to_float(grad_sum[base + j]);
      grad_x[base + j] = from_float<T>(g);
    }
  }
  if (!shared_acc) return;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) partial[j] = acc[j];
}

__device__ __forceinline__ float sigmoid(float v) {
  return 1.0f / (1.0f + expf(-v));
}

template <class T>
__global__ void swiglu_forward(const T* __restrict__ a, const T* __restrict__ b,
                               T* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float av = to_float(a[i]);
    const float silu = round_to<T>(av * sigmoid(av));
    out[i] = from_float<T>(silu * to_float(b[i]));
  }
}

template <class T>
__global__ void swiglu_backward(const T* __restrict__ a, const T* __restrict__ b,
                                const T* __restrict__ grad_out, T* __restrict__ grad_a,
                                T* __restrict__ grad_b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float av = to_float(a[i]), g = to_float(grad_out[i]);
    const float sg = sigmoid(av);
    const float g_silu = round_to<T>(g * to_float(b[i]));  // mul's gradient to silu(a)
    grad_a[i] = from_float<T>(g_silu * sg * (1.0f + av * (1.0f - sg)));
    grad_b[i] = from_float<T>(g * round_to<T>(av * sg));
  }
}

unsigned row_threads(int64_t cols) {
  const int64_t warps = (cols + 31) / 32;
  return static_cast<unsigned>(warps * 32 < kMaxThreads ? warps * 32 : kMaxThreads);
}

template <class T, class W>
void norm_forward(const RmsNormForwardArgs& a, cudaStream_t stream) {
  using O = std::conditional_t<std::is_same_v<W, float>, float, T>;
  rms_norm_forward<T, W, O><<<static_cast<unsigned>(a.rows), row_threads(a.cols), 0, stream>>>(
      static_cast<const T*>(a.x), static_cast<const T*>(a.residual),
      static_cast<const W*>(a.weight), static_cast<T*>(a.sum), static_cast<O*>(a.y), a.rstd, a.cols,
      a.eps);
}

template <class T, class W>
void norm_backward(const RmsNormBackwardArgs& a, cudaStream_t stream) {
  using O = std::conditional_t<std::is_same_v<W, float>, float, T>;
  // Beside block_sum's 33 floats, within the 48 KiB a block gets without opting in.
  const bool shared_acc = a.cols * sizeof(float) <= 46 * 1024;
  const size_t bytes = shared_acc ? a.cols * sizeof(float) : 0;
  rms_norm_backward<T, W, O>
      <<<static_cast<unsigned>(a.blocks), row_threads(a.cols), bytes, stream>>>(
          static_cast<const O*>(a.grad_y), static_cast<const T*>(a.grad_sum),
          static_cast<const T*>(a.s), static_cast<const W*>(a.weight), a.rstd,
          static_cast<T*>(a.grad_x), a.grad_weight_partial, a.rows, a.cols, shared_acc);
}

// Enough blocks of 256 threads to fill an H100/H200 several times, fewer for small tensors.
unsigned elementwise_blocks(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
}

}  // namespace

const char* launch_rms_norm_forward(const RmsNormForwardArgs& a, void* stream) {
  if (a.rows == 0 || a.cols == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_pair(a.dtype, a.weight_dtype,
                       [&](auto t, auto w) { norm_forward<decltype(t), decltype(w)>(a, s); });
}

const char* launch_rms_norm_backward(const RmsNormBackwardArgs& a, void* stream) {
  if (a.rows == 0 || a.cols == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_pair(a.dtype, a.weight_dtype,
                       [&](auto t, auto w) { norm_backward<decltype(t), decltype(w)>(a, s); });
}

const char* launch_swiglu_forward(const SwigluArgs& a, void* stream) {
  if (a.n == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_elementwise(a.dtype, [&](auto t) {
    using T = decltype(t);
    swiglu_forward<T><<<elementwise_blocks(a.n), 256, 0, s>>>(
        static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), a.n);
  });
}

const char* launch_swiglu_backward(const SwigluArgs& a, void* stream) {
  if (a.n == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_elementwise(a.dtype, [&](auto t) {
    using T = decltype(t);
    swiglu_backward<T><<<elementwise_blocks(a.n), 256, 0, s>>>(
        static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<const T*>(a.grad_out),
        static_cast<T*>(a.grad_a), static_cast<T*>(a.grad_b), a.n);
  });
}

}  // namespace trainer::nn
