#include "nn/fused/fused_gpt_ops.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include "nn/fused/fused_gpt_kernel.h"
#include "nn/fused/fused_launch.h"

namespace trainer::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// An optional bias, as the functions take it: autograd's functions take no undefined tensor.
using OptionalTensor = std::optional<torch::Tensor>;

OptionalTensor optional(const torch::Tensor& t) {
  return t.defined() ? OptionalTensor(t) : std::nullopt;
}

// The partial rows of the weight's and bias's gradients: at most this many blocks (LayerNorm) or
// groups of rows (bias + GELU) run a backward.
constexpr int64_t kPartialRows = 512;

int64_t rows_of(const torch::Tensor& t) {
  const int64_t cols = t.size(-1);
  return cols == 0 ? 0 : t.numel() / cols;
}

// The dtype of y: float32 with a float32 weight, else x's.
torch::ScalarType norm_out_type(const torch::Tensor& x, const torch::Tensor& weight) {
  return weight.scalar_type() == torch::kFloat ? torch::kFloat : x.scalar_type();
}

// y, mean and rstd of s [rows, D] (x, or x + residual written into `sum`).
struct NormForward {
  torch::Tensor y, mean, rstd;
};

NormForward norm_forward(const torch::Tensor& x, const torch::Tensor& residual,
                         const torch::Tensor& weight, const torch::Tensor& bias,
                         const torch::Tensor& sum, double eps) {
  const int64_t rows = rows_of(x);
  const auto stats = x.options().dtype(torch::kFloat);
  NormForward out{torch::empty(x.sizes(), x.options().dtype(norm_out_type(x, weight))),
                  torch::empty({rows}, stats), torch::empty({rows}, stats)};
  LayerNormForwardArgs a;
  a.x = x.data_ptr();
  a.residual = residual.defined() ? residual.data_ptr() : nullptr;
  a.weight = weight.data_ptr();
  a.bias = bias.defined() ? bias.data_ptr() : nullptr;
  a.sum = sum.defined() ? sum.data_ptr() : nullptr;
  a.y = out.y.data_ptr();
  a.mean = out.mean.data_ptr<float>();
  a.rstd = out.rstd.data_ptr<float>();
  a.rows = rows;
  a.cols = x.size(-1);
  a.eps = static_cast<float>(eps);
  a.dtype = fused_dtype_of(x);
  a.weight_dtype = fused_dtype_of(weight);
  run_kernel(&launch_layer_norm_forward, a, x, "layer_norm");
  return out;
}

// {grad of s, grad of weight, grad of bias (undefined without one)} for s [..., D] normalised
// with `mean` and `rstd`; grad_sum: the gradient that reached s itself (undefined: none).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> norm_backward(
    const torch::Tensor& s, const torch::Tensor& weight, bool with_bias, const torch::Tensor& mean,
    const torch::Tensor& rstd, torch::Tensor grad_y, torch::Tensor grad_sum) {
  const int64_t cols = s.size(-1), rows = rows_of(s);
  const auto out_type = norm_out_type(s, weight);
  grad_y = grad_y.defined() ? grad_y.to(out_type).contiguous()
                            : torch::zeros(s.sizes(), s.options().dtype(out_type));
  if (grad_sum.defined()) grad_sum = grad_sum.to(s.scalar_type()).contiguous();
  const int64_t blocks = std::max<int64_t>(1, std::min(rows, kPartialRows));
  // No rows: no block writes its partial row, the sums are zeros.
  const auto partial_options = s.options().dtype(torch::kFloat);
  auto partial = [&] {
    return rows == 0 ? torch::zeros({blocks, cols}, partial_options)
                     : torch::empty({blocks, cols}, partial_options);
  };
  auto grad_x = torch::empty_like(s);
  auto partial_w = partial();
  auto partial_b = with_bias ? partial() : torch::Tensor();
  LayerNormBackwardArgs a;
  a.grad_y = grad_y.data_ptr();
  a.grad_sum = grad_sum.defined() ? grad_sum.data_ptr() : nullptr;
  a.s = s.data_ptr();
  a.weight = weight.data_ptr();
  a.mean = mean.data_ptr<float>();
  a.rstd = rstd.data_ptr<float>();
  a.grad_x = grad_x.data_ptr();
  a.grad_weight_partial = partial_w.data_ptr<float>();
  a.grad_bias_partial = with_bias ? partial_b.data_ptr<float>() : nullptr;
  a.rows = rows;
  a.cols = cols;
  a.blocks = blocks;
  a.dtype = fused_dtype_of(s);
  a.weight_dtype = fused_dtype_of(weight);
  run_kernel(&launch_layer_norm_backward, a, s, "layer_norm");
  const auto w_type = weight.scalar_type();
  return {grad_x, partial_w.sum(0).to(w_type),
          with_bias ? partial_b.sum(0).to(w_type) : torch::Tensor()};  // [..., D], [D], [D]
}

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const OptionalTensor& bias,
                               double eps) {
    const auto xc = x.contiguous(), wc = weight.contiguous();
    const auto bc = bias ? bias->contiguous() : torch::Tensor();
    auto out = norm_forward(xc, {}, wc, bc, {}, eps);
    ctx->save_for_backward({xc, wc, out.mean, out.rstd});
    ctx->saved_data["bias"] = bias.has_value();
    return out.y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_x, grad_w, grad_b] = norm_backward(
        saved[0], saved[1], ctx->saved_data["bias"].toBool(), saved[2], saved[3], grads[0], {});
    return {grad_x, grad_w, grad_b, torch::Tensor()};
  }
};

class AddLayerNormFunction : public torch::autograd::Function<AddLayerNormFunction> {
 public:
  // {s, y}
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& residual, const torch::Tensor& weight,
                               const OptionalTensor& bias, double eps) {
    const auto xc = x.contiguous(), wc = weight.contiguous();
    const auto bc = bias ? bias->contiguous() : torch::Tensor();
    auto sum = torch::empty_like(xc);
    auto out = norm_forward(xc, residual.contiguous(), wc, bc, sum, eps);
    ctx->save_for_backward({sum, wc, out.mean, out.rstd});
    ctx->saved_data["bias"] = bias.has_value();
    return {sum, out.y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_s, grad_w, grad_b] =
        norm_backward(saved[0], saved[1], ctx->saved_data["bias"].toBool(), saved[2], saved[3],
                      grads[1], grads[0]);
    return {grad_s, grad_s, grad_w, grad_b, torch::Tensor()};
  }
};

// The bias + GELU kernels' arguments for h [rows, D] and bias (undefined: none).
BiasGeluArgs gelu_args(const torch::Tensor& h, const torch::Tensor& bias) {
  BiasGeluArgs a;
  a.h = h.data_ptr();
  a.bias = bias.defined() ? bias.data_ptr() : nullptr;
  a.rows = rows_of(h);
  a.cols = h.size(-1);
  a.row_groups = std::max<int64_t>(1, std::min(a.rows, kPartialRows));
  a.dtype = fused_dtype_of(h);
  return a;
}

class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h,
                               const OptionalTensor& bias) {
    const auto hc = h.contiguous();
    const auto bc = bias ? bias->contiguous() : torch::Tensor();
    auto out = torch::empty_like(hc);
    auto a = gelu_args(hc, bc);
    a.out = out.data_ptr();
    run_kernel(&launch_bias_gelu_forward, a, hc, "bias_gelu");
    ctx->save_for_backward({hc, bc});
    ctx->saved_data["bias"] = bias.has_value();
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& h = saved[0];
    const bool with_bias = ctx->saved_data["bias"].toBool();
    const auto bias = with_bias ? saved[1] : torch::Tensor();
    const auto grad_out = grads[0].to(h.scalar_type()).contiguous();
    auto grad_h = torch::empty_like(h);
    auto a = gelu_args(h, bias);
    // No rows: no group writes its partial row, the sum is zeros.
    const auto partial_options = h.options().dtype(torch::kFloat);
    auto partial = !with_bias    ? torch::Tensor()
                   : a.rows == 0 ? torch::zeros({a.row_groups, a.cols}, partial_options)
                                 : torch::empty({a.row_groups, a.cols}, partial_options);
    a.grad_out = grad_out.data_ptr();
    a.grad_h = grad_h.data_ptr();
    a.grad_bias_partial = with_bias ? partial.data_ptr<float>() : nullptr;
    run_kernel(&launch_bias_gelu_backward, a, h, "bias_gelu");
    return {grad_h, with_bias ? partial.sum(0).to(h.scalar_type()) : torch::Tensor()};
  }
};

// The weight and the optional bias of a norm over x's last dimension, on x's device.
bool norm_params_fit(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias) {
  if (weight.dim() != 1 || weight.device() != x.device() || weight.size(0) != x.size(-1))
    return false;
  return !bias.defined() || (bias.sizes() == weight.sizes() && bias.device() == x.device() &&
                             bias.scalar_type() == weight.scalar_type());
}

// x's device and sizes with elements of `type`, normalised by `weight` and `bias`.
bool norm_supports(const torch::Tensor& x, torch::ScalarType type, const torch::Tensor& weight,
                   const torch::Tensor& bias) {
  if (!kFusedKernelsBuilt || !x.is_cuda() || x.dim() < 1 || !norm_params_fit(x, weight, bias))
    return false;
  const auto w = weight.scalar_type();
  return kernel_dtype(type) && (w == type || w == torch::kFloat);
}

}  // namespace

bool fused_layer_norm_supports(const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias) {
  return norm_supports(x, x.scalar_type(), weight, bias);
}

torch::Tensor fused_layer_norm(const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, double eps) {
  return LayerNormFunction::apply(x, weight, optional(bias), eps);
}

bool fused_add_layer_norm_supports(const torch::Tensor& x, const torch::Tensor& residual,
                                   const torch::Tensor& weight, const torch::Tensor& bias) {
  if (residual.device() != x.device() || residual.sizes() != x.sizes()) return false;
  return norm_supports(x, torch::promote_types(x.scalar_type(), residual.scalar_type()), weight,
                       bias);
}

std::pair<torch::Tensor, torch::Tensor> fused_add_layer_norm(const torch::Tensor& x,
                                                             const torch::Tensor& residual,
                                                             const torch::Tensor& weight,
                                                             const torch::Tensor& bias,
                                                             double eps) {
  const auto type = torch::promote_types(x.scalar_type(), residual.scalar_type());
  auto out =
      AddLayerNormFunction::apply(x.to(type), residual.to(type), weight, optional(bias), eps);
  return {out[0], out[1]};
}

bool fused_bias_gelu_supports(const torch::Tensor& h, const torch::Tensor& bias) {
  if (!kFusedKernelsBuilt || !h.is_cuda() || h.dim() < 1 || !kernel_dtype(h.scalar_type()))
    return false;
  return !bias.defined() || (bias.dim() == 1 && bias.size(0) == h.size(-1) &&
                             bias.device() == h.device() && bias.scalar_type() == h.scalar_type());
}

torch::Tensor fused_bias_gelu(const torch::Tensor& h, const torch::Tensor& bias) {
  return BiasGeluFunction::apply(h, optional(bias));
}

}  // namespace trainer::nn
