#include "nn/aligned_linear.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <vector>

namespace trainer::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class AlignedLinear : public torch::autograd::Function<AlignedLinear> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight) {
    const int64_t v = weight.size(0), c = weight.size(1);
    const auto device = x.device().type();
    const bool autocast = at::autocast::is_autocast_enabled(device);
    const auto dtype = autocast ? at::autocast::get_autocast_dtype(device) : x.scalar_type();
    const auto xc = x.reshape({-1, c}).to(dtype);  // [N, C]
    const auto wc = weight.to(dtype);              // [V, C]
    const int64_t n = xc.size(0), vp = aligned_columns(v);
    const auto padded = torch::empty({n, vp}, xc.options());  // [N, Vp]
    auto first = padded.narrow(/*dim=*/1, /*start=*/0, /*length=*/v);  // [N, V]
    at::mm_out(first, xc, wc.t());
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    // The first V columns as a tensor of their own over the padded storage, not a view of it: a
    // loss may then write its gradient over them in place (a view made inside a custom function
    // may not be modified in place).
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1), strides(shape.size());
    int64_t stride = vp;
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= shape[i];
    }
    shape.push_back(v);
    strides.push_back(1);
    auto out = torch::empty({0}, padded.options());
    out.set_(padded.storage(), /*storage_offset=*/0, shape, strides);
    return out;  // [..., V]
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& xc = saved[0];  // [N, C]
    const auto& wc = saved[1];  // [V, C]
    // [N, V]: a view of the padded rows when the loss wrote its gradient over the output.
    const auto g = grad_outputs[0].reshape({xc.size(0), wc.size(0)}).to(xc.scalar_type());
    const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    auto dx = g.mm(wc).to(x_dtype);      // [N, C]
    auto dw = g.t().mm(xc).to(w_dtype);  // [V, C]
    std::vector<int64_t> shape(grad_outputs[0].sizes().begin(), grad_outputs[0].sizes().end() - 1);
    shape.push_back(xc.size(1));
    return {dx.view(shape), dw};
  }
};

}  // namespace

torch::Tensor aligned_linear(const torch::Tensor& x, const torch::Tensor& weight) {
  if (aligned_columns(weight.size(0)) == weight.size(0)) return torch::linear(x, weight);
  return AlignedLinear::apply(x, weight);
}

}  // namespace trainer::nn
