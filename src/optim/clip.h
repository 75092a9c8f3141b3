// Clipping gradients by their global norm, as torch.nn.utils.clip_grad_norm_(foreach=True) does:
// a few multi-tensor ops and no host read.
#pragma once

#include <torch/types.h>

#include <functional>
#include <vector>

#include "optim/optimizer.h"

namespace trainer::optim {

// For gradients sharded over processes: the sum over them of this process's squared norm (a
// float32 scalar, undefined when it holds no gradient), a collective that every process must call.
using SquaredNormSum = std::function<torch::Tensor(const torch::Tensor& squared)>;

// The L2 norm of all the defined gradients of `params` together (over every shard with `sum`), a
// float32 device scalar; undefined when no gradient is defined. Nothing waits for the device.
torch::Tensor grad_norm(const std::vector<torch::Tensor>& params, const SquaredNormSum& sum = {});

// Clips the gradients of `params`, whose global norm is `total` (grad_norm), as clip_grad_norm
// does, for a step of `optimizer`: one that takes device inputs gets
// max(1, (total + 1e-6) / max_norm) as its gradient divisor (`inputs.grad_scale`, which must be
// undefined) and divides in its kernel, saving a pass over every gradient; any other has its
// gradients scaled here. Nothing waits for the device.
void clip_for_step(const Optimizer& optimizer, const std::vector<torch::Tensor>& params,
                   double max_norm, const torch::Tensor& total, KernelInputs& inputs);

}  // namespace trainer::optim
