#include "nn/fused/fused_rotary_ops.h"

#include "nn/fused/fused_launch.h"
#include "nn/fused/fused_rotary_kernel.h"

namespace trainer::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x with its last dimension contiguous (the kernel's one requirement on its inputs' layout).
torch::Tensor last_contiguous(const torch::Tensor& x) {
  return x.size(-1) <= 1 || x.stride(-1) == 1 ? x : x.contiguous();
}

// The kernel's view of `in` [B, T, H, hd] (last dimension contiguous) rotated into `out`.
RotaryTensor rotary_tensor(const torch::Tensor& in, const torch::Tensor& out) {
  RotaryTensor t;
  t.in = in.data_ptr();
  t.out = out.data_ptr();
  t.heads = in.size(2);
  t.stride_b = in.stride(0);
  t.stride_t = in.stride(1);
  t.stride_h = in.stride(2);
  return t;
}

// {q, k} (forward: the inputs; backward: the outputs' gradients) rotated by the kernel into new
// contiguous tensors of `out_type`.
std::pair<torch::Tensor, torch::Tensor> run_rotary(bool backward, const torch::Tensor& q,
                                                   const torch::Tensor& k, const RotaryTables& r,
                                                   torch::ScalarType out_type) {
  auto q_out = torch::empty(q.sizes(), q.options().dtype(out_type));
  auto k_out = torch::empty(k.sizes(), k.options().dtype(out_type));
  RotaryArgs a;
  a.q = rotary_tensor(q, q_out);
  a.k = rotary_tensor(k, k_out);
  a.cos = r.cos.data_ptr<float>();
  a.sin = r.sin.data_ptr<float>();
  a.positions = r.positions.defined() ? r.positions.data_ptr<int64_t>() : nullptr;
  a.start = r.start;
  a.batch = q.size(0);
  a.seq = q.size(1);
  a.head_dim = q.size(3);
  a.dtype = fused_dtype_of(backward ? q_out : q);  // q and k's own dtype
  a.table_dtype = r.dtype == torch::kFloat ? FusedDtype::float32 : a.dtype;
  run_kernel(backward ? &launch_rotary_backward : &launch_rotary_forward, a, q, "rotary");
  return {q_out, k_out};
}

// The dtype of the rotated tensors: float32 tables promote lower-precision q and k.
torch::ScalarType rotated_type(torch::ScalarType dtype, const RotaryTables& r) {
  return r.dtype == torch::kFloat ? torch::kFloat : dtype;
}

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  // {q rotated, k rotated}
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const RotaryTables& tables) {
    RotaryTables r = tables;
    if (r.positions.defined()) r.positions = r.positions.contiguous();
    const auto dtype = q.scalar_type();
    auto [q_out, k_out] =
        run_rotary(false, last_contiguous(q), last_contiguous(k), r, rotated_type(dtype, r));
    ctx->saved_data["cos"] = r.cos;
    ctx->saved_data["sin"] = r.sin;
    ctx->saved_data["packed"] = r.positions.defined();
    if (r.positions.defined()) ctx->saved_data["positions"] = r.positions;
    ctx->saved_data["start"] = r.start;
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    ctx->saved_data["table_dtype"] = static_cast<int64_t>(r.dtype);
    ctx->saved_data["q_sizes"] = q.sizes().vec();
    ctx->saved_data["k_sizes"] = k.sizes().vec();
    return {q_out, k_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RotaryTables r;
    r.cos = ctx->saved_data["cos"].toTensor();
    r.sin = ctx->saved_data["sin"].toTensor();
    if (ctx->saved_data["packed"].toBool()) r.positions = ctx->saved_data["positions"].toTensor();
    r.start = ctx->saved_data["start"].toInt();
    r.dtype = static_cast<torch::ScalarType>(ctx->saved_data["table_dtype"].toInt());
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto type = rotated_type(dtype, r);
    // An output no gradient reached contributes none: zeros of its sizes.
    auto grad = [&](size_t i, const char* sizes) {
      if (grads[i].defined()) return last_contiguous(grads[i].to(type));
      return torch::zeros(ctx->saved_data[sizes].toIntVector(), r.cos.options().dtype(type));
    };
    auto [grad_q, grad_k] = run_rotary(true, grad(0, "q_sizes"), grad(1, "k_sizes"), r, dtype);
    return {grad_q, grad_k, torch::Tensor()};
  }
};

}  // namespace

bool fused_rotary_supports(const torch::Tensor& q, const torch::Tensor& k, const RotaryTables& r) {
  if (!kFusedKernelsBuilt || !q.is_cuda() || q.dim() != 4 || k.dim() != 4) return false;
  if (k.device() != q.device() || k.scalar_type() != q.scalar_type()) return false;
  if (!kernel_dtype(q.scalar_type())) return false;
  const int64_t B = q.size(0), T = q.size(1), hd = q.size(3);
  if (k.size(0) != B || k.size(1) != T || k.size(3) != hd || hd % 2 != 0) return false;
  if (r.dtype != torch::kFloat && r.dtype != q.scalar_type()) return false;
  for (const auto* table : {&r.cos, &r.sin}) {
    if (!table->defined() || table->device() != q.device() || table->dim() != 2) return false;
    if (table->scalar_type() != torch::kFloat || !table->is_contiguous()) return false;
    if (table->size(1) != hd / 2 || table->size(0) != r.cos.size(0)) return false;
  }
  if (!r.positions.defined()) return r.start >= 0 && r.start + T <= r.cos.size(0);
  return r.positions.device() == q.device() && r.positions.scalar_type() == torch::kLong &&
         r.positions.dim() == 2 && r.positions.size(0) == B && r.positions.size(1) == T;
}

std::pair<torch::Tensor, torch::Tensor> fused_rotary(const torch::Tensor& q, const torch::Tensor& k,
                                                     const RotaryTables& r) {
  auto out = RotaryFunction::apply(q, k, r);
  return {out[0], out[1]};
}

}  // namespace trainer::nn
