#include "losses/loss.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "losses/xent_kernel.h"

#ifdef TRAINER_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainer::losses {
namespace {

#ifdef TRAINER_WITH_CUDA
bool gpu_kernel_built() {
  return true;
}

void launch_on_current_stream(const XentArgs& a, torch::Device device) {
  const auto stream = c10::cuda::getCurrentCUDAStream(device.index());
  const std::string error = launch_softmax_xent(a, stream.stream());
  if (!error.empty()) throw std::runtime_error("cross_entropy: the CUDA kernel failed: " + error);
}
#else
bool gpu_kernel_built() {
  return false;
}

void launch_on_current_stream(const XentArgs& /*a*/, torch::Device /*device*/) {
  throw std::logic_error("cross_entropy: built without the CUDA kernel");
}
#endif

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Mean softmax cross-entropy with label smoothing over logits [N, K] and int64 targets [N]
// (kIgnoreIndex rows left out of the mean, their gradients zero). In
// training its forward computes each row's gradient along with its loss and writes it over the
// logits (their own memory: nothing reads logits after the loss), so backward only scales it by
// the incoming gradient: the one [N, K] tensor alive in backward is the logits', in their dtype,
// where log_softmax + nll_loss over a float32 copy hold three float32 ones; that bounds the memory
// of language models with large vocabularies. On a GPU one fused kernel (losses/xent_cuda.cu)
// reads each logit twice and writes it once; on the CPU blocks of rows go through float32.
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
    auto x = own && rows ? logits : logits.contiguous().clone();  // [N, K]
    auto t = targets.to(x.device(), torch::kLong);                // [N]
    const auto kept = t.ne(kIgnoreIndex);                         // [N] bool
    t = t.masked_fill(~kept, 0).contiguous();                     // [N] in [0, K)
    auto row_loss = x.is_cuda() && gpu_kernel_built()
                        ? rows_on_gpu(x, t, smoothing, training)
                        : rows_on_cpu(x, t, smoothing, training);  // [N] float32
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

 private:
  // Rows of float32 at a time: about 64 MiB of them.
  static torch::Tensor rows_on_cpu(torch::Tensor& x, const torch::Tensor& t, double smoothing,
                                   bool training) {
    const int64_t n = x.size(0), k = x.size(1);
    const int64_t block = std::max<int64_t>(1, (int64_t{16} << 20) / std::max<int64_t>(k, 1));
    auto row_loss = torch::empty(
        {n}, x.options().dtype(x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat));
    for (int64_t r = 0; r < n; r += block) {
      const int64_t e = std::min(n, r + block);
      auto rows = x.slice(/*dim=*/0, r, e);                   // [b, K]
      const auto tt = t.slice(/*dim=*/0, r, e).unsqueeze(1);  // [b, 1]
      const auto f = rows.scalar_type() == torch::kDouble ? rows : rows.to(torch::kFloat);
      const auto lse = f.logsumexp(/*dim=*/1, /*keepdim=*/true);  // [b, 1]
      auto loss = lse - f.gather(/*dim=*/1, tt);                  // [b, 1]
      if (smoothing > 0.0) loss = (1.0 - smoothing) * loss + smoothing * (lse - f.mean(1, true));
      row_loss.slice(/*dim=*/0, r, e).copy_(loss.squeeze(1));
      if (!training) continue;
      auto g = (f - lse).exp_();  // [b, K] softmax
      g.scatter_add_(/*dim=*/1, tt, torch::full({e - r, 1}, -(1.0 - smoothing), g.options()));
      if (smoothing > 0.0) g.sub_(smoothing / static_cast<double>(k));
      rows.copy_(g);
    }
    return row_loss;
  }

  static torch::Tensor rows_on_gpu(torch::Tensor& x, const torch::Tensor& t, double smoothing,
                                   bool training);
};

// On the CPU, from this many classes on, the memory-lean cross-entropy above; below, ATen's own
// (cross_entropy_loss: one operator forward, two backward), whose extra [N, K] tensor is small.
// On a GPU the fused kernel always: it moves a sixth of the bytes.
constexpr int64_t kLeanFromClasses = 8192;

torch::Tensor SoftmaxCrossEntropy::rows_on_gpu(torch::Tensor& x, const torch::Tensor& t,
                                               double smoothing, bool training) {
  auto row_loss = torch::empty({x.size(0)}, x.options().dtype(torch::kFloat));
  XentArgs a;
  a.logits = x.data_ptr();
  a.grad = training ? x.data_ptr() : nullptr;
  a.targets = t.data_ptr<int64_t>();
  a.row_loss = row_loss.data_ptr<float>();
  a.rows = x.size(0);
  a.cols = x.size(1);
  a.row_stride = x.stride(0);
  a.smoothing = static_cast<float>(smoothing);
  switch (x.scalar_type()) {
    case torch::kFloat:
      a.dtype = XentDtype::float32;
      break;
    case torch::kBFloat16:
      a.dtype = XentDtype::bfloat16;
      break;
    case torch::kHalf:
      a.dtype = XentDtype::float16;
      break;
    default:
      throw std::invalid_argument("cross_entropy: logits of dtype " +
                                  std::string(c10::toString(x.scalar_type())) +
                                  " on a GPU; float32, bfloat16 or float16 expected");
  }
  launch_on_current_stream(a, x.device());
  // Written behind autograd's back: a new version, so that anything else that saved the logits
  // for its backward fails loudly there instead of reading gradients.
  if (training) torch::autograd::impl::bump_version(x);
  return row_loss;
}

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
        if ((x.is_cuda() && gpu_kernel_built()) || x.size(1) >= kLeanFromClasses) {
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
