// Clipping gradients by their global norm, as torch.nn.utils.clip_grad_norm_(foreach=True) does:
// a few multi-tensor ops and no host read.
#pragma once

#include <torch/types.h>

#include <vector>

namespace trainer::optim {

// Scales the defined gradients of `params` by min(1, max_norm / (total + 1e-6)), total being the
// L2 norm of all of them together, and returns total, a float32 device scalar (undefined when no
// gradient is defined). Nothing waits for the device.
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace trainer::optim
