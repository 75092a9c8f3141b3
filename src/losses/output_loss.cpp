#include "losses/output_loss.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <algorithm>

#include "losses/loss.h"
#include "losses/xent_rows.h"
#include "nn/aligned_linear.h"
#include "nn/autocast.h"

namespace trainer::losses {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// At most this many chunks: each adds its product into the weight's gradient [V, C], a pass over
// V * C floats, so that more and smaller chunks trade little memory for much time (with Liger's
// rule alone, 128 chunks of 16 rows made a small GPT's CPU step 4.5x slower).
constexpr int64_t kMaxChunks = 8;

// Liger-Kernel's rule, rows such that a chunk of logits [rows, V] holds about as many elements as
// hidden [N, C], but at least N / kMaxChunks; a power of two.
int64_t default_chunk_rows(int64_t n, int64_t v, int64_t c) {
  const int64_t chunks = std::max<int64_t>(1, (v + c - 1) / std::max<int64_t>(c, 1));
  const int64_t rows =
      std::max<int64_t>({int64_t{1}, (n + chunks - 1) / chunks, (n + kMaxChunks - 1) / kMaxChunks});
  int64_t pow2 = 1;
  while (pow2 < rows) pow2 <<= 1;
  return pow2;
}

class LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
 public:
  // hidden [N, C], weight [V, C], targets [N] -> the mean loss; the gradients computed here.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets,
                               double smoothing, int64_t chunk_rows) {
    const auto type = product_type(hidden, weight);
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto h = hidden.to(type), w = weight.to(type);  // [N, C], [V, C]
    const int64_t n = h.size(0), v = w.size(0), c = h.size(1);
    auto t = targets.to(h.device(), torch::kLong).reshape({n});  // [N]
    const auto kept = t.ne(kIgnoreIndex);                        // [N] bool
    t = t.masked_fill(~kept, 0).contiguous();                    // [N] in [0, V)
    const auto acc = type == torch::kDouble ? torch::kDouble : torch::kFloat;
    // Each row's share of the mean: 1 / (rows kept), 0 for a row left out.
    const auto share = kept.to(acc) / kept.sum().clamp_min(1).to(acc);  // [N]
    const bool want_h = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    auto grad_h = want_h ? torch::empty({n, c}, hidden.options()) : torch::Tensor();  // [N, C]
    auto grad_w = want_w ? torch::zeros({v, c}, weight.options().dtype(acc)) : torch::Tensor();
    auto loss = torch::zeros({}, h.options().dtype(acc));
    const int64_t rows = chunk_rows > 0 ? chunk_rows : default_chunk_rows(n, v, c);
    for (int64_t r = 0; r < n; r += rows) {
      const int64_t e = std::min(n, r + rows);
      const auto hc = h.slice(/*dim=*/0, r, e);      // [b, C]
      const auto sc = share.slice(/*dim=*/0, r, e);  // [b]
      auto logits = nn::aligned_linear(hc, w);       // [b, V], rows aligned
      const auto t_c = t.slice(/*dim=*/0, r, e);
      loss.add_((softmax_xent_rows(logits, t_c, smoothing, want_h || want_w) * sc).sum());
      if (!want_h && !want_w) continue;
      logits.mul_(sc.unsqueeze(1));  // [b, V]: the rows' gradients of the mean
      if (want_h) grad_h.slice(/*dim=*/0, r, e).copy_(logits.mm(w));  // [b, C]
      if (want_w && type == acc) {
        grad_w.addmm_(logits.t(), hc);  // [V, C]
      } else if (want_w) {
        grad_w.add_(logits.t().mm(hc));  // [V, C], each chunk's rounded once
      }
    }
    ctx->save_for_backward({grad_h, grad_w});
    ctx->saved_data["weight_type"] = static_cast<int64_t>(weight.scalar_type());
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& g = grad_outputs[0];  // scalar
    torch::Tensor grad_h = saved[0], grad_w = saved[1];
    // Scaled in place: backward runs once.
    if (grad_h.defined()) grad_h.mul_(g);
    if (grad_w.defined()) {
      grad_w =
          grad_w.mul_(g).to(static_cast<torch::ScalarType>(ctx->saved_data["weight_type"].toInt()));
    }
    return {grad_h, grad_w, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor chunked_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                           const torch::Tensor& targets, double smoothing,
                                           int64_t chunk_rows) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "chunked_linear_cross_entropy: hidden [N, C] and weight [V, C] expected, got ",
              hidden.sizes(), " and ", weight.sizes());
  TORCH_CHECK(targets.numel() == hidden.size(0), "chunked_linear_cross_entropy: ", targets.numel(),
              " targets for ", hidden.size(0), " rows");
  return LinearCrossEntropy::apply(hidden, weight, targets, smoothing, chunk_rows);
}

OutputLoss output_loss(const config::TrainConfig& cfg) {
  if (cfg.loss != "cross_entropy") return nullptr;
  const Loss unfused = loss_registry().get(cfg.loss)(cfg);
  const double smoothing = cfg.label_smoothing;
  return [unfused, smoothing](const torch::Tensor& hidden, const torch::Tensor& weight,
                              const torch::Tensor& targets) {
    // hidden [..., C] and targets [...]: one row per target.
    const auto h = hidden.reshape({-1, hidden.size(-1)});  // [N, C]
    if (product_type(h, weight) == torch::kHalf) {
      return unfused(nn::aligned_linear(h, weight), targets.flatten());
    }
    return chunked_linear_cross_entropy(h, weight, targets.flatten(), smoothing);
  };
}

torch::ScalarType product_type(const torch::Tensor& hidden, const torch::Tensor& weight) {
  const auto device = hidden.device().type();
  const auto common = torch::promote_types(hidden.scalar_type(), weight.scalar_type());
  if (common != torch::kDouble && nn::autocast_enabled(device)) {
    return nn::autocast_dtype(device);
  }
  return common;
}

}  // namespace trainer::losses
