// The gpt model's fused kernels (nn/fused/fused_gpt_kernel.h). LayerNorm: one block per row, the
// row read from global memory once and kept as float32 in shared memory where it fits (else read
// again, mostly from L2) for the two-pass statistics and the output; the backward's weight and
// bias gradients accumulate in float32 partial rows, one per block, that the caller sums. Bias +
// GELU: each thread owns a few adjacent columns and walks its group of rows, so the bias is read
// once and the backward sums the bias's gradient in registers. Rows whose width and pointers
// allow it move 16 bytes of the input's dtype at a time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "nn/fused/fused_dispatch.cuh"
#include "nn/fused/fused_gpt_kernel.h"
#include "nn/fused/fused_math.cuh"
#include "util/cuda_convert.cuh"

namespace trainer::nn {
namespace {

constexpr int kMaxThreads = 256;
// Beside the reductions' few floats, within the 48 KiB a block gets without opting in.
constexpr int64_t kSharedBytes = 46 * 1024;

using cuda::from_float;
using cuda::round_to;
using cuda::to_float;

// N adjacent elements, loaded and stored as one access.
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// p[i .. i + N) as floats; p + i aligned to the pack.
template <int N, class T>
__device__ __forceinline__ void load(const T* p, int64_t i, float (&out)[N]) {
  const Pack<T, N> pack = *reinterpret_cast<const Pack<T, N>*>(p + i);
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = to_float(pack.v[k]);
}

template <int N, class T>
__device__ __forceinline__ void store(T* p, int64_t i, const float (&in)[N]) {
  Pack<T, N> pack;
#pragma unroll
  for (int k = 0; k < N; ++k) pack.v[k] = from_float<T>(in[k]);
  *reinterpret_cast<Pack<T, N>*>(p + i) = pack;
}

// The block's sums of v[0..K), returned to every thread (blockDim.x a multiple of 32, at most
// 1024). Consecutive calls are safe: every thread reads the totals before any writes them again.
template <int K>
__device__ __forceinline__ void block_sum(float (&v)[K]) {
  __shared__ float warp_sums[K][32];
  __shared__ float totals[K];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    for (int offset = 16; offset > 0; offset >>= 1)
      v[k] += __shfl_xor_sync(0xffffffffu, v[k], offset);
    if (lane == 0) warp_sums[k][warp] = v[k];
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float t = lane < warps ? warp_sums[k][lane] : 0.0f;
      for (int offset = 16; offset > 0; offset >>= 1) t += __shfl_xor_sync(0xffffffffu, t, offset);
      if (lane == 0) totals[k] = t;
    }
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = totals[k];
}

// The chunk of N elements at column c * N of the row: from the shared copy `cache` when there is
// one, else from `s` (the thread's own earlier writes where `s` is the sum).
template <int N, class T>
__device__ __forceinline__ void row_chunk(const float* cache, const T* s, int64_t c,
                                          float (&v)[N]) {
  if (cache != nullptr) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = cache[c * N + k];
  } else {
    load<N>(s, c * N, v);
  }
}

// T: x, residual, sum; W: weight, bias; O: y (float32 with a float32 weight, else T).
template <class T, class W, class O, int N>
__global__ void __launch_bounds__(kMaxThreads)
    layer_norm_forward(const T* __restrict__ x, const T* __restrict__ residual,
                       const W* __restrict__ weight, const W* __restrict__ bias, T* sum,
                       O* __restrict__ y, float* __restrict__ mean_out,
                       float* __restrict__ rstd_out, int64_t cols, float eps, bool cached) {
  extern __shared__ float shared[];
  float* cache = cached ? shared : nullptr;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols, chunks = cols / N;
  const T* s = residual != nullptr ? sum + base : x + base;
  float stats[1] = {0.0f};
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[N];
    load<N>(x + base, c * N, v);
    if (residual != nullptr) {
      float r[N];
      load<N>(residual + base, c * N, r);
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = round_to<T>(v[k] + r[k]);
      store<N>(sum + base, c * N, v);
    }
#pragma unroll
    for (int k = 0; k < N; ++k) {
      stats[0] += v[k];
      if (cache != nullptr) cache[c * N + k] = v[k];
    }
  }
  block_sum(stats);
  const float mean = stats[0] / static_cast<float>(cols);
  stats[0] = 0.0f;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[N];
    row_chunk<N>(cache, s, c, v);
#pragma unroll
    for (int k = 0; k < N; ++k) stats[0] += (v[k] - mean) * (v[k] - mean);
  }
  block_sum(stats);
  const float rstd = rsqrtf(stats[0] / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) {
    mean_out[blockIdx.x] = mean;
    rstd_out[blockIdx.x] = rstd;
  }
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[N], w[N], b[N] = {};
    row_chunk<N>(cache, s, c, v);
    load<N>(weight, c * N, w);
    if (bias != nullptr) load<N>(bias, c * N, b);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = (v[k] - mean) * rstd * w[k] + b[k];
    store<N>(y + base, c * N, v);
  }
}

// The thread's chunks of the weight's and the bias's sums (b null: no bias): zeros where src_w
// is null, else copies of src_w and src_b.
template <int N>
__device__ __forceinline__ void fill_sums(float* w, float* b, const float* src_w,
                                          const float* src_b, int64_t chunks) {
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int64_t j = c * N + k;
      w[j] = src_w != nullptr ? src_w[j] : 0.0f;
      if (b != nullptr) b[j] = src_w != nullptr ? src_b[j] : 0.0f;
    }
  }
}

// The gradient of s for each row a block visits, and the block's partial sums over those rows of
// grad_y * x_hat (the weight's) and grad_y (the bias's).
template <class T, class W, class O, int N>
__global__ void __launch_bounds__(kMaxThreads)
    layer_norm_backward(const O* __restrict__ grad_y, const T* __restrict__ grad_sum,
                        const T* __restrict__ s, const W* __restrict__ weight,
                        const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                        T* __restrict__ grad_x, float* __restrict__ grad_weight_partial,
                        float* __restrict__ grad_bias_partial, int64_t rows, int64_t cols,
                        bool shared_acc) {
  // The sums, in shared memory where they fit: thread t owns the chunks t, t + blockDim.x, ...
  // in every row, so no two threads touch one column.
  extern __shared__ float shared[];
  const bool with_bias = grad_bias_partial != nullptr;
  float* partial_w = grad_weight_partial + static_cast<int64_t>(blockIdx.x) * cols;
  float* partial_b =
      with_bias ? grad_bias_partial + static_cast<int64_t>(blockIdx.x) * cols : nullptr;
  float* acc_w = shared_acc ? shared : partial_w;
  float* acc_b = shared_acc ? shared + cols : partial_b;
  const int64_t chunks = cols / N;
  fill_sums<N>(acc_w, with_bias ? acc_b : nullptr, nullptr, nullptr, chunks);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * cols;
    const float mean = mean_in[row], rstd = rstd_in[row];
    float sums[2] = {0.0f, 0.0f};  // over the row: dx_hat, dx_hat * x_hat
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float dy[N], v[N], w[N];
      load<N>(grad_y + base, c * N, dy);
      load<N>(s + base, c * N, v);
      load<N>(weight, c * N, w);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float x_hat = (v[k] - mean) * rstd, dx_hat = dy[k] * w[k];
        sums[0] += dx_hat;
        sums[1] += dx_hat * x_hat;
        acc_w[c * N + k] += dy[k] * x_hat;
        if (with_bias) acc_b[c * N + k] += dy[k];
      }
    }
    block_sum(sums);
    const float mean_dx_hat = sums[0] * inv_cols, mean_dx_hat_x_hat = sums[1] * inv_cols;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float dy[N], v[N], w[N], g[N] = {};
      load<N>(grad_y + base, c * N, dy);
      load<N>(s + base, c * N, v);
      load<N>(weight, c * N, w);
      if (grad_sum != nullptr) load<N>(grad_sum + base, c * N, g);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float x_hat = (v[k] - mean) * rstd;
        g[k] += rstd * (dy[k] * w[k] - mean_dx_hat - x_hat * mean_dx_hat_x_hat);
      }
      store<N>(grad_x + base, c * N, g);
    }
  }
  if (shared_acc) fill_sums<N>(partial_w, partial_b, acc_w, acc_b, chunks);
}

// ATen's tanh approximation (GeluCUDAKernelImpl), in float32.
constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

__device__ __forceinline__ float gelu(float v) {
  const float cube = v * v * v;
  return 0.5f * v * (1.0f + tanhf(kBeta * (v + kKappa * cube)));
}

// d gelu(v) / dv, as GeluBackwardCUDAKernelImpl computes it.
__device__ __forceinline__ float gelu_grad(float v) {
  const float v_sq = v * v, cube = v_sq * v;
  const float tanh_inner = tanhf(kBeta * (v + kKappa * cube));
  const float left_derivative = 0.5f * (1.0f + tanh_inner);
  const float inner_derivative = kBeta * (1.0f + 3.0f * kKappa * v_sq);
  return left_derivative + 0.5f * v * (1.0f - tanh_inner * tanh_inner) * inner_derivative;
}

// h + bias rounded to T, as ATen's add leaves it (h itself without a bias).
template <class T, int N>
__device__ __forceinline__ void add_bias(float (&v)[N], const float (&b)[N], bool with_bias) {
  if (!with_bias) return;
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = round_to<T>(v[k] + b[k]);
}

// Thread x of the grid's row of blocks owns the chunk of N columns at x * N; block row y the rows
// y, y + gridDim.y, ...
template <class T, int N>
__global__ void __launch_bounds__(kMaxThreads)
    bias_gelu_forward(const T* __restrict__ h, const T* __restrict__ bias, T* __restrict__ out,
                      int64_t rows, int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols / N) return;
  float b[N] = {};
  if (bias != nullptr) load<N>(bias, c * N, b);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    float v[N];
    load<N>(h + row * cols, c * N, v);
    add_bias<T>(v, b, bias != nullptr);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = gelu(v[k]);
    store<N>(out + row * cols, c * N, v);
  }
}

template <class T, int N>
__global__ void __launch_bounds__(kMaxThreads)
    bias_gelu_backward(const T* __restrict__ h, const T* __restrict__ bias,
                       const T* __restrict__ grad_out, T* __restrict__ grad_h,
                       float* __restrict__ grad_bias_partial, int64_t rows, int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols / N) return;
  float b[N] = {}, acc[N] = {};
  if (bias != nullptr) load<N>(bias, c * N, b);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    float v[N], g[N];
    load<N>(h + row * cols, c * N, v);
    load<N>(grad_out + row * cols, c * N, g);
    add_bias<T>(v, b, bias != nullptr);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      g[k] = round_to<T>(g[k] * gelu_grad(v[k]));
      acc[k] += g[k];
    }
    store<N>(grad_h + row * cols, c * N, g);
  }
  if (grad_bias_partial == nullptr) return;
  float* partial = grad_bias_partial + static_cast<int64_t>(blockIdx.y) * cols + c * N;
#pragma unroll
  for (int k = 0; k < N; ++k) partial[k] = acc[k];
}

unsigned block_threads(int64_t chunks) {
  const int64_t warps = (chunks + 31) / 32;
  return static_cast<unsigned>(warps * 32 < kMaxThreads ? warps * 32 : kMaxThreads);
}

// Whether p (null: absent) is aligned to `bytes`.
bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The elements of T in 16 bytes.
template <class T>
constexpr int kPack = static_cast<int>(16 / sizeof(T));

template <class T, class W, class O>
bool packs_fit(const LayerNormForwardArgs& a) {
  constexpr int n = kPack<T>;
  return a.cols % n == 0 && aligned(a.x, n * sizeof(T)) && aligned(a.residual, n * sizeof(T)) &&
         aligned(a.sum, n * sizeof(T)) && aligned(a.y, n * sizeof(O)) &&
         aligned(a.weight, n * sizeof(W)) && aligned(a.bias, n * sizeof(W));
}

template <class T, class W, class O>
bool packs_fit(const LayerNormBackwardArgs& a) {
  constexpr int n = kPack<T>;
  return a.cols % n == 0 && aligned(a.grad_y, n * sizeof(O)) &&
         aligned(a.grad_sum, n * sizeof(T)) && aligned(a.s, n * sizeof(T)) &&
         aligned(a.grad_x, n * sizeof(T)) && aligned(a.weight, n * sizeof(W));
}

template <class T>
bool packs_fit(const BiasGeluArgs& a) {
  constexpr size_t bytes = 16;
  return a.cols % kPack<T> == 0 && aligned(a.h, bytes) && aligned(a.bias, bytes) &&
         aligned(a.grad_out, bytes) && aligned(a.out, bytes) && aligned(a.grad_h, bytes);
}

template <class T, class W, int N>
void norm_forward(const LayerNormForwardArgs& a, cudaStream_t stream) {
  using O = std::conditional_t<std::is_same_v<W, float>, float, T>;
  const bool cached = a.cols * static_cast<int64_t>(sizeof(float)) <= kSharedBytes;
  const size_t bytes = cached ? a.cols * sizeof(float) : 0;
  layer_norm_forward<T, W, O, N>
      <<<static_cast<unsigned>(a.rows), block_threads(a.cols / N), bytes, stream>>>(
          static_cast<const T*>(a.x), static_cast<const T*>(a.residual),
          static_cast<const W*>(a.weight), static_cast<const W*>(a.bias), static_cast<T*>(a.sum),
          static_cast<O*>(a.y), a.mean, a.rstd, a.cols, a.eps, cached);
}

template <class T, class W, int N>
void norm_backward(const LayerNormBackwardArgs& a, cudaStream_t stream) {
  using O = std::conditional_t<std::is_same_v<W, float>, float, T>;
  const bool shared_acc = 2 * a.cols * static_cast<int64_t>(sizeof(float)) <= kSharedBytes;
  const size_t bytes = shared_acc ? 2 * a.cols * sizeof(float) : 0;
  layer_norm_backward<T, W, O, N>
      <<<static_cast<unsigned>(a.blocks), block_threads(a.cols / N), bytes, stream>>>(
          static_cast<const O*>(a.grad_y), static_cast<const T*>(a.grad_sum),
          static_cast<const T*>(a.s), static_cast<const W*>(a.weight), a.mean, a.rstd,
          static_cast<T*>(a.grad_x), a.grad_weight_partial, a.grad_bias_partial, a.rows, a.cols,
          shared_acc);
}

// The grid of the bias + GELU kernels: the chunks of a row across x, the row groups across y.
dim3 gelu_grid(int64_t chunks, int64_t row_groups) {
  const int64_t threads = block_threads(chunks);
  return dim3(static_cast<unsigned>((chunks + threads - 1) / threads),
              static_cast<unsigned>(row_groups));
}

template <class T, int N>
void gelu_forward(const BiasGeluArgs& a, cudaStream_t stream) {
  const int64_t chunks = a.cols / N;
  bias_gelu_forward<T, N><<<gelu_grid(chunks, a.row_groups), block_threads(chunks), 0, stream>>>(
      static_cast<const T*>(a.h), static_cast<const T*>(a.bias), static_cast<T*>(a.out), a.rows,
      a.cols);
}

template <class T, int N>
void gelu_backward(const BiasGeluArgs& a, cudaStream_t stream) {
  const int64_t chunks = a.cols / N;
  bias_gelu_backward<T, N><<<gelu_grid(chunks, a.row_groups), block_threads(chunks), 0, stream>>>(
      static_cast<const T*>(a.h), static_cast<const T*>(a.bias), static_cast<const T*>(a.grad_out),
      static_cast<T*>(a.grad_h), a.grad_bias_partial, a.rows, a.cols);
}

}  // namespace

const char* launch_layer_norm_forward(const LayerNormForwardArgs& a, void* stream) {
  if (a.rows == 0 || a.cols == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_pair(a.dtype, a.weight_dtype, [&](auto t, auto w) {
    using T = decltype(t);
    using W = decltype(w);
    using O = std::conditional_t<std::is_same_v<W, float>, float, T>;
    packs_fit<T, W, O>(a) ? norm_forward<T, W, kPack<T>>(a, s) : norm_forward<T, W, 1>(a, s);
  });
}

const char* launch_layer_norm_backward(const LayerNormBackwardArgs& a, void* stream) {
  if (a.rows == 0 || a.cols == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_pair(a.dtype, a.weight_dtype, [&](auto t, auto w) {
    using T = decltype(t);
    using W = decltype(w);
    using O = std::conditional_t<std::is_same_v<W, float>, float, T>;
    packs_fit<T, W, O>(a) ? norm_backward<T, W, kPack<T>>(a, s) : norm_backward<T, W, 1>(a, s);
  });
}

const char* launch_bias_gelu_forward(const BiasGeluArgs& a, void* stream) {
  if (a.rows == 0 || a.cols == 0) return "";
  if (a.row_groups < 1 || a.row_groups > 65535) return "row_groups out of [1, 65535]";
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_elementwise(a.dtype, [&](auto t) {
    using T = decltype(t);
    packs_fit<T>(a) ? gelu_forward<T, kPack<T>>(a, s) : gelu_forward<T, 1>(a, s);
  });
}

const char* launch_bias_gelu_backward(const BiasGeluArgs& a, void* stream) {
  if (a.rows == 0 || a.cols == 0) return "";
  if (a.row_groups < 1 || a.row_groups > 65535) return "row_groups out of [1, 65535]";
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_elementwise(a.dtype, [&](auto t) {
    using T = decltype(t);
    packs_fit<T>(a) ? gelu_backward<T, kPack<T>>(a, s) : gelu_backward<T, 1>(a, s);
  });
}

}  // namespace trainer::nn
