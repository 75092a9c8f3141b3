#include "losses/loss.h"

#include <torch/torch.h>

namespace trainer::losses {

const LossRegistry& loss_registry() {
  static const LossRegistry registry = [] {
    LossRegistry r("loss");
    r.add("cross_entropy", [](const config::TrainConfig& cfg) -> Loss {
      const auto options =
          torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(cfg.label_smoothing);
      return [options](const torch::Tensor& logits, const torch::Tensor& targets) {
        // Sequences: [B, T, K] logits and [B, T] targets become B * T predictions.
        auto flat_targets = targets.flatten();                          // [N]
        auto flat_logits = logits.reshape({flat_targets.size(0), -1});  // [N, K]
        return torch::nn::functional::cross_entropy(flat_logits, flat_targets, options);
      };
    });
    return r;
  }();
  return registry;
}

}  // namespace trainer::losses
