#include "nn/aligned_linear.h"

#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <vector>

#include "nn/autocast.h"

namespace trainer::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A tensor of `sizes` and `strides` over the storage of `t` from its first element on: not a
// view of `t` (a view made inside a custom function may not be written in place).
torch::Tensor over_storage_of(const torch::Tensor& t, at::IntArrayRef sizes,
                              at::IntArrayRef strides) {
  auto out = torch::empty({0}, t.options());
  out.set_(t.storage(), t.storage_offset(), sizes, strides);
  return out;
}

class AlignedLinear : public torch::autograd::Function<AlignedLinear> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight) {
    const int64_t v = weight.size(0), c = weight.size(1), vp = aligned_columns(v);
    const auto device = x.device().type();
    const bool autocast = autocast_enabled(device);
    const auto dtype = autocast ? autocast_dtype(device) : x.scalar_type();
    const auto xc = x.reshape({-1, c}).to(dtype);  // [N, C]
    // The weight with zero rows up to Vp, in the compute dtype (autocast's cast, into a larger
    // buffer): every size of the product a multiple of 64, and the padding columns of its
    // result exactly zero.
    auto wp = torch::empty({vp, c}, xc.options());  // [Vp, C]
    wp.narrow(/*dim=*/0, /*start=*/0, /*length=*/v).copy_(weight);
    wp.narrow(/*dim=*/0, /*start=*/v, /*length=*/vp - v).zero_();
    const auto padded = xc.mm(wp.t());  // [N, Vp]
    ctx->save_for_backward({xc, wp});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["v"] = v;
    ctx->saved_data["result"] = reinterpret_cast<int64_t>(padded.data_ptr());
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1), strides(shape.size());
    int64_t stride = vp;
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= shape[i];
    }
    shape.push_back(v);
    strides.push_back(1);
    // The first V columns of each row: a loss may write its gradient over them in place.
    return over_storage_of(padded, shape, strides);  // [..., V]
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& xc = saved[0];  // [N, C]
    const auto& wp = saved[1];  // [Vp, C]
    const int64_t n = xc.size(0), vp = wp.size(0), v = ctx->saved_data["v"].toInt();
    const auto& go = grad_outputs[0];  // [..., V]
    const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    torch::Tensor dx, dw;  // undefined where not needed (a frozen weight: LoRA's base)
    const bool need_dx = ctx->needs_input_grad(0), need_dw = ctx->needs_input_grad(1);
    const auto result = ctx->saved_data["result"].toInt();
    if (reinterpret_cast<int64_t>(go.data_ptr()) == result && go.dim() >= 2 && go.stride(-1) == 1 &&
        go.stride(-2) == vp && go.scalar_type() == xc.scalar_type() && go.numel() == n * v) {
      // The loss wrote the gradient over the forward's result: its padding columns are still
      // the product's zeros, so the whole padded rows take part, every size aligned.
      const auto g = over_storage_of(go, {n, vp}, {vp, 1});  // [N, Vp]
      if (need_dx) dx = g.mm(wp);
      if (need_dw) dw = g.t().mm(xc).narrow(/*dim=*/0, /*start=*/0, /*length=*/v);
    } else {
      const auto g = go.reshape({n, v}).to(xc.scalar_type());  // [N, V]
      const auto w = wp.narrow(/*dim=*/0, /*start=*/0, /*length=*/v);
      if (need_dx) dx = g.mm(w);
      if (need_dw) dw = g.t().mm(xc);
    }
    std::vector<int64_t> shape(go.sizes().begin(), go.sizes().end() - 1);
    shape.push_back(xc.size(1));
    return {need_dx ? dx.to(x_dtype).view(shape) : dx, need_dw ? dw.to(w_dtype) : dw};
  }
};

}  // namespace

torch::Tensor aligned_linear(const torch::Tensor& x, const torch::Tensor& weight) {
  if (aligned_columns(weight.size(0)) == weight.size(0)) return torch::linear(x, weight);
  // Named with its arguments for observers: FLOPs count the product of x and the V rows of the
  // weight (engine/measure/flops.h), not the padded one it runs.
  RECORD_FUNCTION(kAlignedLinear, std::vector<c10::IValue>({x, weight}));
  return AlignedLinear::apply(x, weight);
}

}  // namespace trainer::nn
