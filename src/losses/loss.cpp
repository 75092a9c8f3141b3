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
        return torch::nn::functional::cross_entropy(logits, targets, options);
      };
    });
    return r;
  }();
  return registry;
}

}  // namespace trainer::losses
