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

// The floating-point operations of a training step of the forward pass `fn`: the forward as
// count_flops counts it, and the products its backward computes, counted from which operands of
// each counted operation require gradients (`fn` runs with gradients enabled): a product's
// gradient for its input (when the input requires one) and for its weight (when the weight is
// trained), each as many as the product's forward. A frozen weight (LoRA's base) costs no
// weight gradient; a first layer whose input requires no gradient costs no input gradient.
// Attention's backward: dV, dP (for q or k), dQ and dK, each half its forward.
int64_t count_train_flops(const std::function<void()>& fn);

// TFLOP/s of an n x n by n x n matrix product in `dtype` on `device`, the best of 5 after 2
// untimed: n = 8192 on a GPU, 1024 on the CPU; the operands draw from no random generator.
// Synchronises the device around each product.
double matmul_peak_tflops(torch::Device device, c10::ScalarType dtype);

}  // namespace trainer::engine
