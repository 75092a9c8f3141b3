// The fused rotary-embedding kernel (nn/fused/fused_rotary_kernel.h). One block per token
// (grid-strided): the token's table row is found once (its packed position or start + t), then the
// block's threads walk the (head, pair) grid of q's heads followed by k's, each thread reading the
// two halves of its pair (consecutive threads read consecutive elements) and writing both rotated
// values. Products are rounded where ATen's composition rounds them, and multiplied with
// __fmul_rn so that no product is contracted into a fused multiply-add ATen's kernels do not do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "nn/fused/fused_dispatch.cuh"
#include "nn/fused/fused_math.cuh"
#include "nn/fused/fused_rotary_kernel.h"
#include "util/cuda_convert.cuh"

namespace trainer::nn {
namespace {

constexpr int kMaxThreads = 256;
constexpr int64_t kMaxBlocks = 65536;

using cuda::from_float;
using cuda::round_to;
using cuda::to_float;

// In: the elements read; Out: those written; R: the dtype the table values are rounded to.
// kBackward: the transposed rotation (the sines' signs swapped).
template <class In, class Out, class R, bool kBackward>
__global__ void __launch_bounds__(kMaxThreads) rotary(RotaryArgs a) {
  const int half = static_cast<int>(a.head_dim / 2);
  const int q_heads = static_cast<int>(a.q.heads);
  const int pairs = static_cast<int>(a.q.heads + a.k.heads) * half;
  const int64_t tokens = a.batch * a.seq;
  for (int64_t token = blockIdx.x; token < tokens; token += gridDim.x) {
    const int64_t b = token / a.seq, t = token % a.seq;
    const int64_t row = (a.positions != nullptr ? a.positions[token] : a.start + t) * half;
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
      const int head = i / half, j = i % half;
      const bool is_q = head < q_heads;
      const int64_t h = is_q ? head : head - q_heads;
      const In* in = static_cast<const In*>(is_q ? a.q.in : a.k.in) +
                     b * (is_q ? a.q.stride_b : a.k.stride_b) +
                     t * (is_q ? a.q.stride_t : a.k.stride_t) +
                     h * (is_q ? a.q.stride_h : a.k.stride_h);
      Out* out = static_cast<Out*>(is_q ? a.q.out : a.k.out) +
                 (token * (is_q ? a.q.heads : a.k.heads) + h) * a.head_dim;
      const float c = round_to<R>(__ldg(a.cos + row + j)), s = round_to<R>(__ldg(a.sin + row + j));
      const float x1 = to_float(in[j]), x2 = to_float(in[j + half]);
      const float x1c = round_to<Out>(__fmul_rn(x1, c)), x2s = round_to<Out>(__fmul_rn(x2, s));
      const float x2c = round_to<Out>(__fmul_rn(x2, c)), x1s = round_to<Out>(__fmul_rn(x1, s));
      if (kBackward) {
        out[j] = from_float<Out>(__fadd_rn(x1c, x2s));
        out[j + half] = from_float<Out>(__fsub_rn(x2c, x1s));
      } else {
        out[j] = from_float<Out>(__fsub_rn(x1c, x2s));
        out[j + half] = from_float<Out>(__fadd_rn(x2c, x1s));
      }
    }
  }
}

// T: q and k's dtype; R: the tables' rounding; the rotated tensors' dtype float32 with float32
// tables, else T.
template <class T, class R, bool kBackward>
void launch(const RotaryArgs& a, cudaStream_t stream) {
  using O = std::conditional_t<std::is_same_v<R, float>, float, T>;
  using In = std::conditional_t<kBackward, O, T>;
  using Out = std::conditional_t<kBackward, T, O>;
  const int64_t pairs = (a.q.heads + a.k.heads) * (a.head_dim / 2);
  const int64_t warps = (pairs + 31) / 32;
  const auto threads = static_cast<unsigned>(warps * 32 < kMaxThreads ? warps * 32 : kMaxThreads);
  const int64_t tokens = a.batch * a.seq;
  const auto blocks = static_cast<unsigned>(tokens < kMaxBlocks ? tokens : kMaxBlocks);
  rotary<In, Out, R, kBackward><<<blocks, threads, 0, stream>>>(a);
}

bool empty(const RotaryArgs& a) {
  return a.batch == 0 || a.seq == 0 || a.head_dim == 0 || a.q.heads + a.k.heads == 0;
}

}  // namespace

const char* launch_rotary_forward(const RotaryArgs& a, void* stream) {
  if (empty(a)) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_pair(a.dtype, a.table_dtype,
                       [&](auto t, auto r) { launch<decltype(t), decltype(r), false>(a, s); });
}

const char* launch_rotary_backward(const RotaryArgs& a, void* stream) {
  if (empty(a)) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_pair(a.dtype, a.table_dtype,
                       [&](auto t, auto r) { launch<decltype(t), decltype(r), true>(a, s); });
}

}  // namespace trainer::nn
