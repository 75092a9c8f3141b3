#include "losses/loss.h"

#include <torch/torch.h>

namespace trainer::losses {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Mean softmax cross-entropy with label smoothing over logits [N, K] and int64 targets [N], in
// float32 at least. It keeps only the softmax for backward and turns it into the gradient in
// place: one [N, K] tensor alive in backward where log_softmax + nll_loss hold three, which is
// what bounds the memory of language models with large vocabularies.
class SoftmaxCrossEntropy : public torch::autograd::Function<SoftmaxCrossEntropy> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, double smoothing) {
    const auto x = logits.scalar_type() == torch::kDouble ? logits : logits.to(torch::kFloat);
    const auto lse = x.logsumexp(/*dim=*/1, /*keepdim=*/true);                          // [N, 1]
    auto loss = lse.squeeze(1) - x.gather(/*dim=*/1, targets.unsqueeze(1)).squeeze(1);  // [N]
    if (smoothing > 0.0) loss = (1.0 - smoothing) * loss + smoothing * (lse.squeeze(1) - x.mean(1));
    auto probs = (x - lse).exp_();  // [N, K] softmax
    ctx->save_for_backward({probs, targets});
    ctx->saved_data["smoothing"] = smoothing;
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss.mean();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto grad = saved[0];  // the softmax, overwritten: backward runs once
    const auto& targets = saved[1];
    const double smoothing = ctx->saved_data["smoothing"].toDouble();
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    const int64_t n = grad.size(0), k = grad.size(1);
    // d mean / d x = (softmax - (1 - s) onehot - s / K) / N, times the incoming gradient.
    grad.scatter_add_(/*dim=*/1, targets.unsqueeze(1),
                      torch::full({n, 1}, -(1.0 - smoothing), grad.options()));
    if (smoothing > 0.0) grad.sub_(smoothing / static_cast<double>(k));
    grad.mul_(grad_outputs[0].to(grad.scalar_type()) / static_cast<double>(n));
    return {grad.to(dtype), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

const LossRegistry& loss_registry() {
  static const LossRegistry registry = [] {
    LossRegistry r("loss");
    r.add("cross_entropy", [](const config::TrainConfig& cfg) -> Loss {
      const double smoothing = cfg.label_smoothing;
      return [smoothing](const torch::Tensor& logits, const torch::Tensor& targets) {
        // Sequences: [B, T, K] logits and [B, T] targets become B * T predictions.
        auto flat_targets = targets.flatten();                          // [N]
        auto flat_logits = logits.reshape({flat_targets.size(0), -1});  // [N, K]
        return SoftmaxCrossEntropy::apply(flat_logits, flat_targets, smoothing);
      };
    });
    return r;
  }();
  return registry;
}

}  // namespace trainer::losses
