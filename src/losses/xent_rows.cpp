#include "losses/xent_rows.h"

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
constexpr bool kBuilt = true;

void launch_on_current_stream(const XentArgs& a, torch::Device device) {
  const auto stream = c10::cuda::getCurrentCUDAStream(device.index());
  const std::string error = launch_softmax_xent(a, stream.stream());
  if (!error.empty()) throw std::runtime_error("cross_entropy: the CUDA kernel failed: " + error);
}
#else
constexpr bool kBuilt = false;

void launch_on_current_stream(const XentArgs& /*a*/, torch::Device /*device*/) {
  throw std::logic_error("cross_entropy: built without the CUDA kernel");
}
#endif

// Rows of float32 at a time: about 64 MiB of them.
torch::Tensor rows_on_cpu(torch::Tensor& x, const torch::Tensor& t, double smoothing,
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

torch::Tensor rows_on_gpu(torch::Tensor& x, const torch::Tensor& t, double smoothing,
                          bool training) {
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

bool xent_kernel_built() {
  return kBuilt;
}

torch::Tensor softmax_xent_rows(torch::Tensor& x, const torch::Tensor& t, double smoothing,
                                bool training) {
  return x.is_cuda() && kBuilt ? rows_on_gpu(x, t, smoothing, training)
                               : rows_on_cpu(x, t, smoothing, training);
}

}  // namespace trainer::losses
