#include "losses/loss.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "losses/xent_rows.h"

namespace trainer::losses {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Mean softmax cross-entropy with label smoothing over logits [N, K] and int64 targets [N]
// (kIgnoreIndex rows left out of the mean, their gradients zero). In
// training its forward computes each row's gradient along with its loss and writes it over the
// logits (their own memory: nothing reads logits after the loss), so backward only scales it by
// the incoming gradient: the one [N, K] tensor alive in backward is the logits', in their dtype,
// where log_softmax + nll_loss over a float32 copy hold three float32 ones; that bounds the memory
// of language models with large vocabularies (losses/xent_rows.h computes the rows).
class SoftmaxCrossEntropy : public torch::autograd::Function<SoftmaxCrossEntropy> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, double smoothing) {
    const bool training = logits.requires_grad();
    // Written in place: the logits' own memory (rows may lie further apart than K: a padded
    // buffer, nn/aligned_linear.h), unless they are the caller's: a tensor that requires its own
    // gradient (a leaf), or a view of one.
    const auto caller_owns = [](const at::TensorBase& t) {
      return t.is_leaf() && t.requires_grad();
    };
    const bool own = !caller_owns(logits) && !(logits.is_view() && caller_owns(logits._base()));
    const bool rows = logits.stride(1) == 1 && logits.stride(0) >= logits.size(1);
    auto x = own && rows ? logits : logits.contiguous().clone();         // [N, K]
    auto t = targets.to(x.device(), torch::kLong);                       // [N]
    const auto kept = t.ne(kIgnoreIndex);                                // [N] bool
    t = t.masked_fill(~kept, 0).contiguous();                            // [N] in [0, K)
    const auto row_loss = softmax_xent_rows(x, t, smoothing, training);  // [N] float32
    // Each row's share of the mean: 1 / (rows kept), 0 for a row left out.
    const auto share = kept.to(row_loss.scalar_type()) /
                       kept.sum().clamp_min(1).to(row_loss.scalar_type());  // [N]
    if (training) ctx->save_for_backward({x, share});
    return (row_loss * share).sum();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto grad = saved[0];  // the rows' gradients, scaled once: backward runs once
    grad.mul_((saved[1] * grad_outputs[0]).unsqueeze(1));  // [N, 1]
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};

// On the CPU, from this many classes on, the memory-lean cross-entropy above; below, ATen's own
// (cross_entropy_loss: one operator forward, two backward), whose extra [N, K] tensor is small.
// On a GPU the fused kernel always: it moves a sixth of the bytes.
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
        if ((x.is_cuda() && xent_kernel_built()) || x.size(1) >= kLeanFromClasses) {
          return SoftmaxCrossEntropy::apply(x, t, smoothing);
        }
        // In float32 at least, as autocast runs cross_entropy.
        if (x.scalar_type() != torch::kFloat && x.scalar_type() != torch::kDouble) {
          x = x.to(torch::kFloat);
        }
        // The sum over the targets kept (ATen's ignore_index) over their count, at least 1: no
        // host read.
        namespace F = torch::nn::functional;
        const auto kept = t.ne(kIgnoreIndex).sum().clamp_min(1).to(x.scalar_type());
        return F::cross_entropy(
                   x, t,
                   F::CrossEntropyFuncOptions().label_smoothing(smoothing).reduction(torch::kSum)) /
               kept;
      };
    });
    return r;
  }();
  return registry;
}

}  // namespace trainer::losses
