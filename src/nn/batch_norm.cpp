#include "nn/batch_norm.h"
#include "util/device.h"

#include <torch/torch.h>

namespace trainer::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct SumHolder : torch::CustomClassHolder {
  AllReduceSum sum;
};

// A sum over every process whose backward is the same sum of the gradients: each process's
// share of the global statistics receives the gradient of every process's loss.
struct GlobalSum : public torch::autograd::Function<GlobalSum> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& local,
                               const c10::intrusive_ptr<SumHolder>& holder) {
    ctx->saved_data["sum"] = c10::IValue::make_capsule(holder);
    torch::Tensor out = local.clone();
    holder->sum(out);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<SumHolder>(ctx->saved_data["sum"].toCapsule());
    torch::Tensor g = grads[0].clone();
    holder->sum(g);
    return {g, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor BatchNorm2dImpl::forward(const torch::Tensor& x) {
  if (!sync_.sum || !is_training()) return torch::nn::BatchNorm2dImpl::forward(x);
  TORCH_CHECK(x.dim() == 4, "BatchNorm2d: expected a 4-d input [N, C, H, W], got ", x.sizes());
  const auto& o = options;
  const int64_t channels = x.size(1);
  // Statistics in float32 at least.
  const torch::Tensor xf = x.scalar_type() == torch::kDouble ? x : x.to(torch::kFloat);
  // Every process's count, mean and sum of squared deviations, each in its own row of a
  // [world, 2C + 1] sum (an exact all-gather), combined as in Chan et al.'s parallel variance:
  // no E[x^2] - E[x]^2 cancellation when the mean is large against the spread.
  const auto [local_var, local_mean] = torch::var_mean(xf, {0, 2, 3}, /*correction=*/0);
  const double local_count = static_cast<double>(x.numel() / channels);
  const torch::Tensor row = torch::cat({local_mean, local_var * local_count,
                                        torch::full({1}, local_count, xf.options())});  // [2C+1]
  const int64_t before = sync_.rank, after = sync_.world_size - sync_.rank - 1;
  torch::Tensor rows =
      torch::cat({torch::zeros({before, row.size(0)}, row.options()), row.unsqueeze(0),
                  torch::zeros({after, row.size(0)}, row.options())});  // [W, 2C+1]
  auto holder = c10::make_intrusive<SumHolder>();
  holder->sum = sync_.sum;
  rows = GlobalSum::apply(rows, holder);
  const torch::Tensor counts = rows.select(1, 2 * channels).detach().unsqueeze(1);  // [W, 1]
  const torch::Tensor count = counts.sum();                                         // []
  const torch::Tensor means = rows.slice(1, 0, channels);                           // [W, C]
  const torch::Tensor mean = (means * counts).sum(0) / count;                       // [C]
  const torch::Tensor m2 = rows.slice(1, channels, 2 * channels).sum(0) +
                           ((means - mean).square() * counts).sum(0);  // [C]
  const torch::Tensor var = m2 / count;                                // [C]
  const torch::Tensor invstd = torch::rsqrt(var + o.eps());            // [C]
  torch::Tensor y = (xf - mean.view({1, -1, 1, 1})) * invstd.view({1, -1, 1, 1});
  if (o.affine()) y = y * weight.view({1, -1, 1, 1}) + bias.view({1, -1, 1, 1});

  if (o.track_running_stats()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked += 1;
    const double momentum = o.momentum() ? *o.momentum() : 1.0 / host_double(num_batches_tracked);
    // The running variance is unbiased, as in batch_norm; the count stays on the device.
    const torch::Tensor unbiased = var.detach() * count / (count - 1.0).clamp_min(1.0);
    running_mean.mul_(1.0 - momentum).add_(mean.detach(), momentum);
    running_var.mul_(1.0 - momentum).add_(unbiased, momentum);
  }
  return y.to(x.scalar_type());
}

int64_t sync_batch_norm(torch::nn::Module& model, const BatchNormSync& sync) {
  int64_t n = 0;
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (auto* bn = m->as<BatchNorm2dImpl>()) {
      bn->set_sync(sync);
      ++n;
    }
  }
  return n;
}

}  // namespace trainer::nn
