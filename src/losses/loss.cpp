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
    const bool upcast =
        logits.scalar_type() != torch::kDouble && logits.scalar_type() != torch::kFloat;
    const auto x = upcast ? logits.to(torch::kFloat) : logits;
    const auto lse = x.logsumexp(/*dim=*/1, /*keepdim=*/true);    // [N, 1]
    auto loss = lse - x.gather(/*dim=*/1, targets.unsqueeze(1));  // [N, 1]
    if (smoothing > 0.0) loss = (1.0 - smoothing) * loss + smoothing * (lse - x.mean(1, true));
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
    grad.mul_(grad_outputs[0] / static_cast<double>(n));
    return {grad.scalar_type() == dtype ? grad : grad.to(dtype), torch::Tensor(), torch::Tensor()};
  }
};

// From this many classes on, the memory-lean cross-entropy above; below, ATen's own
// (cross_entropy_loss: one operator forward, two backward), whose extra [N, K] tensor is small.
constexpr int64_t kLeanFromClasses = 8192;

}  // namespace

const LossRegistry& loss_registry() {
  static const LossRegistry registry = [] {
    LossRegistry r("loss");
    r.add("cross_entropy", [](const config::TrainConfig& cfg) -> Loss {
      const double smoothing = cfg.label_smoothing;
      return [smoothing](const torch::Tensor& logits, const torch::Tensor& targets) {
        // Sequences: [B, T, K] logits and [B, T] targets become B * T predictions.
        const bool flat = targets.dim() == 1;
        const auto t = flat ? targets : targets.flatten();                      // [N]
        auto x = flat ? logits : logits.reshape({t.size(0), logits.size(-1)});  // [N, K]
        if (x.size(1) >= kLeanFromClasses) return SoftmaxCrossEntropy::apply(x, t, smoothing);
        // In float32 at least, as autocast runs cross_entropy.
        if (x.scalar_type() != torch::kFloat && x.scalar_type() != torch::kDouble) {
          x = x.to(torch::kFloat);
        }
        return torch::nn::functional::cross_entropy(
            x, t, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(smoothing));
      };
    });
    return r;
  }();
  return registry;
}

}  // namespace trainer::losses
