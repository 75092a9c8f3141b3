// Counting the floating-point operations of model code, for throughput and utilisation figures.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>

namespace trainer::engine {

// The floating-point operations of the matrix products (mm, addmm, bmm, baddbmm), 2-D
// convolutions, scaled-dot-product attention and nn::aligned_linear (its V rows, not the padded
// product it runs) that `fn` runs on this thread, counted from the operations' shapes by a
// RecordFunction observer: 2 per multiply-add, attention 4*B*H*L*S*E
// (its two products), as torch.utils.flop_counter.FlopCounterMode counts them. An operation
// called inside another counted one (autocast's re-dispatch, attention's own products) counts
// once. Other operations (element-wise, normalisation, softmax) are not counted.
int64_t count_flops(const std::function<void()>& fn);

// TFLOP/s of an n x n by n x n matrix product in `dtype` on `device`, the best of 5 after 2
// untimed: n = 8192 on a GPU, 1024 on the CPU; the operands draw from no random generator.
// Synchronises the device around each product.
double matmul_peak_tflops(torch::Device device, c10::ScalarType dtype);

}  // namespace trainer::engine
