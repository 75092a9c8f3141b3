#include "nn/fused/fused_ops.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "nn/fused/fused_kernel.h"
#include "nn/fused/fused_launch.h"

namespace trainer::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The partial rows of the weight's gradient: at most this many blocks run the backward.
constexpr int64_t kNormBackwardBlocks = 512;

// The forward of both norms: s [rows, D] (x, or x + residual written into `sum`), y and rstd.
struct NormForward {
  torch::Tensor y, rstd;
};

NormForward norm_forward(const torch::Tensor& x, const torch::Tensor& residual,
                         const torch::Tensor& weight, const torch::Tensor& sum, double eps) {
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  const auto out_type = weight.scalar_type() == torch::kFloat ? torch::kFloat : x.scalar_type();
  NormForward out{torch::empty(x.sizes(), x.options().dtype(out_type)),
                  torch::empty({rows}, x.options().dtype(torch::kFloat))};
  RmsNormForwardArgs a;
  a.x = x.data_ptr();
  a.residual = residual.defined() ? residual.data_ptr() : nullptr;
  a.weight = weight.data_ptr();
  a.sum = sum.defined() ? sum.data_ptr() : nullptr;
  a.y = out.y.data_ptr();
  a.rstd = out.rstd.data_ptr<float>();
  a.rows = rows;
  a.cols = cols;
  a.eps = static_cast<float>(eps);
  a.dtype = fused_dtype_of(x);
  a.weight_dtype = fused_dtype_of(weight);
  run_kernel(&launch_rms_norm_forward, a, x, "rms_norm");
  return out;
}

// {grad of s, grad of weight} for s [..., D] normalised with `rstd`; grad_sum: the gradient that
// reached s itself (undefined: none).
std::pair<torch::Tensor, torch::Tensor> norm_backward(const torch::Tensor& s,
                                                      const torch::Tensor& weight,
                                                      const torch::Tensor& rstd,
                                                      torch::Tensor grad_y,
                                                      torch::Tensor grad_sum) {
  const int64_t cols = s.size(-1), rows = cols == 0 ? 0 : s.numel() / cols;
  const auto out_type = weight.scalar_type() == torch::kFloat ? torch::kFloat : s.scalar_type();
  grad_y = grad_y.defined() ? grad_y.to(out_type).contiguous()
                            : torch::zeros(s.sizes(), s.options().dtype(out_type));
  if (grad_sum.defined()) grad_sum = grad_sum.to(s.scalar_type()).contiguous();
  const int64_t blocks = std::max<int64_t>(1, std::min(rows, kNormBackwardBlocks));
  auto grad_x = torch::empty_like(s);
  auto partial = torch::empty({blocks, cols}, s.options().dtype(torch::kFloat));
  RmsNormBackwardArgs a;
  a.grad_y = grad_y.data_ptr();
  a.grad_sum = grad_sum.defined() ? grad_sum.data_ptr() : nullptr;
  a.s = s.data_ptr();
  a.weight = weight.data_ptr();
  a.rstd = rstd.data_ptr<float>();
  a.grad_x = grad_x.data_ptr();
  a.grad_weight_partial = partial.data_ptr<float>();
  a.rows = rows;
  a.cols = cols;
  a.blocks = blocks;
  a.dtype = fused_dtype_of(s);
  a.weight_dtype = fused_dtype_of(weight);
  run_kernel(&launch_rms_norm_backward, a, s, "rms_norm");
  return {grad_x, partial.sum(0).to(weight.scalar_type())};  // [..., D], [D]
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
    const auto xc = x.contiguous();
    const auto wc = weight.contiguous();
    auto out = norm_forward(xc, {}, wc, {}, eps);
    ctx->save_for_backward({xc, wc, out.rstd});
    return out.y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_x, grad_w] = norm_backward(saved[0], saved[1], saved[2], grads[0], {});
    return {grad_x, grad_w, torch::Tensor()};
  }
};

class AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
 public:
  // {s, y}
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& residual, const torch::Tensor& weight,
                               double eps) {
    const auto xc = x.contiguous();
    const auto wc = weight.contiguous();
    auto sum = torch::empty_like(xc);
    auto out = norm_forward(xc, residual.contiguous(), wc, sum, eps);
    ctx->save_for_backward({sum, wc, out.rstd});
    return {sum, out.y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_s, grad_w] = norm_backward(saved[0], saved[1], saved[2], grads[1], grads[0]);
    return {grad_s, grad_s, grad_w, torch::Tensor()};
  }
};

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a,
                               const torch::Tensor& b) {
    const auto ac = a.contiguous(), bc = b.contiguous();
    auto out = torch::empty_like(ac);
    SwigluArgs args;
    args.a = ac.data_ptr();
    args.b = bc.data_ptr();
    args.out = out.data_ptr();
    args.n = ac.numel();
    args.dtype = fused_dtype_of(ac);
    run_kernel(&launch_swiglu_forward, args, ac, "swiglu");
    ctx->save_for_backward({ac, bc});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& a = saved[0];
    const auto grad_out = grads[0].to(a.scalar_type()).contiguous();
    auto grad_a = torch::empty_like(a), grad_b = torch::empty_like(a);
    SwigluArgs args;
    args.a = a.data_ptr();
    args.b = saved[1].data_ptr();
    args.grad_out = grad_out.data_ptr();
    args.grad_a = grad_a.data_ptr();
    args.grad_b = grad_b.data_ptr();
    args.n = a.numel();
    args.dtype = fused_dtype_of(a);
    run_kernel(&launch_swiglu_backward, args, a, "swiglu");
    return {grad_a, grad_b};
  }
};

// x's device and sizes with elements of `type`, normalised by `weight`.
bool norm_supports(const torch::Tensor& x, torch::ScalarType type, const torch::Tensor& weight) {
  if (!kFusedKernelsBuilt || !x.is_cuda() || x.dim() < 1 || weight.dim() != 1) return false;
  if (weight.device() != x.device() || weight.size(0) != x.size(-1)) return false;
  const auto w = weight.scalar_type();
  return kernel_dtype(type) && (w == type || w == torch::kFloat);
}

}  // namespace

bool fused_kernels_built() {
  return kFusedKernelsBuilt;
}

bool fused_rms_norm_supports(const torch::Tensor& x, const torch::Tensor& weight) {
  return norm_supports(x, x.scalar_type(), weight);
}

torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return RmsNormFunction::apply(x, weight, eps);
}

bool fused_add_rms_norm_supports(const torch::Tensor& x, const torch::Tensor& residual,
                                 const torch::Tensor& weight) {
  if (residual.device() != x.device() || residual.sizes() != x.sizes()) return false;
  return norm_supports(x, torch::promote_types(x.scalar_type(), residual.scalar_type()), weight);
}

std::pair<torch::Tensor, torch::Tensor> fused_add_rms_norm(const torch::Tensor& x,
                                                           const torch::Tensor& residual,
                                                           const torch::Tensor& weight,
                                                           double eps) {
  const auto type = torch::promote_types(x.scalar_type(), residual.scalar_type());
  auto out = AddRmsNormFunction::apply(x.to(type), residual.to(type), weight, eps);
  return {out[0], out[1]};
}

bool fused_swiglu_supports(const torch::Tensor& a, const torch::Tensor& b) {
  return kFusedKernelsBuilt && a.is_cuda() && b.device() == a.device() && a.sizes() == b.sizes() &&
         a.scalar_type() == b.scalar_type() && kernel_dtype(a.scalar_type());
}

torch::Tensor fused_swiglu(const torch::Tensor& a, const torch::Tensor& b) {
  return SwigluFunction::apply(a, b);
}

}  // namespace trainer::nn
