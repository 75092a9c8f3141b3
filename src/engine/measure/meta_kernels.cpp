#include "engine/measure/meta_kernels.h"

#include <torch/library.h>
#include <torch/torch.h>

#include <mutex>

namespace trainer::engine {
namespace {

at::TensorOptions meta_like(const at::Tensor& t) {
  return t.options().device(at::kMeta);
}

// index_select(self, dim, index): self's shape with dim as long as the index.
at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  auto sizes = self.sizes().vec();
  if (sizes.empty()) return at::empty({}, meta_like(self));
  dim = c10::maybe_wrap_dim(dim, self.dim());
  sizes[static_cast<size_t>(dim)] = index.numel();
  return at::empty(sizes, meta_like(self));
}

// embedding_dense_backward: the weight's gradient [num_weights, C] of grad_output [..., C].
at::Tensor embedding_dense_backward(const at::Tensor& grad_output, const at::Tensor& /*indices*/,
                                    c10::SymInt num_weights, c10::SymInt /*padding_idx*/,
                                    bool /*scale_grad_by_freq*/) {
  return at::empty({num_weights.expect_int(), grad_output.size(-1)}, meta_like(grad_output));
}

// where(condition, self, other): the three broadcast, in self's and other's promoted dtype.
at::Tensor where(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  const auto sizes = at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  return at::empty(sizes, meta_like(self).dtype(at::result_type(self, other)));
}

at::Tensor& where_out(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other,
                      at::Tensor& out) {
  out.resize_(at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes()));
  return out;
}

// scaled_dot_product_attention as the CPU runs it for these inputs: its flash kernel (no T x T
// scores kept; the math path, which a meta tensor's dispatch would take, keeps them), through
// autograd so that backward runs the flash kernel's backward. For the autograd key of meta
// tensors only.
at::Tensor attention_as_on_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::optional<at::Tensor>& mask, double dropout, bool causal,
                               std::optional<double> scale, bool /*enable_gqa*/) {
  return std::get<0>(
      at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout, causal, mask, scale));
}

// The CPU flash kernel's outputs: [B, H, T, D] (laid out [B, T, H, D]) and the float32 log-sum-exp
// [B, H, T] (laid out [B, T, H]).
std::tuple<at::Tensor, at::Tensor> flash_attention(const at::Tensor& q, const at::Tensor& /*k*/,
                                                   const at::Tensor& v, double /*dropout*/,
                                                   bool /*causal*/,
                                                   const std::optional<at::Tensor>& /*mask*/,
                                                   std::optional<double> /*scale*/) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = v.size(3);
  auto out = at::empty({B, T, H, D}, meta_like(q)).transpose(1, 2);
  auto lse = at::empty({B, T, H}, meta_like(q).dtype(at::kFloat)).transpose(1, 2);
  return {out, lse};
}

// Its backward: a gradient like each of query, key and value.
std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_backward(
    const at::Tensor& /*grad_out*/, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& /*out*/, const at::Tensor& /*logsumexp*/, double /*dropout*/, bool /*causal*/,
    const std::optional<at::Tensor>& /*mask*/, std::optional<double> /*scale*/) {
  return {at::empty_like(q), at::empty_like(k), at::empty_like(v)};
}

// abs (logsumexp's): a tensor like `self`.
at::Tensor abs(const at::Tensor& self) {
  return at::empty_like(self);
}

}  // namespace

void register_meta_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta,
                                              __FILE__, __LINE__);
    library->impl("index_select", TORCH_FN(index_select));
    library->impl("embedding_dense_backward", TORCH_FN(embedding_dense_backward));
    library->impl("abs", TORCH_FN(abs));
    library->impl("where.self", TORCH_FN(where));
    library->impl("where.self_out", TORCH_FN(where_out));
    library->impl("_scaled_dot_product_flash_attention_for_cpu", TORCH_FN(flash_attention));
    library->impl("_scaled_dot_product_flash_attention_for_cpu_backward",
                  TORCH_FN(flash_attention_backward));
    static auto* autograd = new torch::Library(torch::Library::IMPL, "aten",
                                               c10::DispatchKey::AutogradMeta, __FILE__, __LINE__);
    autograd->impl("scaled_dot_product_attention", TORCH_FN(attention_as_on_cpu));
  });
}

}  // namespace trainer::engine
