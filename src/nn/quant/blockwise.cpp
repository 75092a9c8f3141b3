#include "nn/quant/blockwise.h"

#include <torch/torch.h>

namespace trainer::nn::quant {
namespace {

constexpr int64_t kLutSize = 65536;

// bitsandbytes' build_quantize_lut: entry i is the code nearest (2i) / 65535 - 1 as the number of
// the code's midpoints strictly below it (float32 arithmetic throughout).
torch::Tensor quantize_lut(const torch::Tensor& code) {
  const torch::Tensor mid = (code.slice(0, 0, -1) + code.slice(0, 1)) * 0.5;
  const torch::Tensor i =
      torch::arange(kLutSize, torch::TensorOptions().dtype(torch::kFloat).device(code.device()));
  const torch::Tensor val = (i * 2.0) / static_cast<double>(kLutSize - 1) - 1.0;
  return torch::searchsorted(mid.contiguous(), val).to(torch::kUInt8);
}

// `a` flat, zero-padded to whole blocks: [blocks, blocksize]. Zeros change no block's absmax.
torch::Tensor padded_blocks(const torch::Tensor& a, int64_t blocksize) {
  const int64_t n = a.numel();
  const int64_t pad = (blocksize - n % blocksize) % blocksize;
  const torch::Tensor flat = a.reshape(-1);
  return (pad ? torch::constant_pad_nd(flat, {0, pad}) : flat).view({-1, blocksize});
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> quantize_blockwise_8bit(const torch::Tensor& a,
                                                                const torch::Tensor& code,
                                                                int64_t blocksize) {
  const int64_t n = a.numel();
  const torch::Tensor blocks = padded_blocks(a.to(torch::kFloat), blocksize);
  const torch::Tensor absmax = blocks.abs().amax(1);
  const torch::Tensor zero = absmax.eq(0).unsqueeze(1);
  // v = clamp(a * (1 / absmax), -1, 1); an all-zero block gets codes 0 (its v is NaN here).
  const torch::Tensor v =
      (blocks * absmax.reciprocal().unsqueeze(1)).clamp(-1, 1).masked_fill(zero, 0);
  // i = trunc(fma((v + 1) * 0.5, 65535, 0.5)): (v + 1) * 0.5 is a multiple of 2^-25 in [0, 1],
  // so its product with 65535 plus 0.5 is exact in float64 and one rounding to float32 is the fma.
  const torch::Tensor t = (v + 1.0) * 0.5;
  const torch::Tensor i = (t.to(torch::kDouble) * static_cast<double>(kLutSize - 1) + 0.5)
                              .to(torch::kFloat)
                              .to(torch::kLong);
  torch::Tensor q =
      quantize_lut(code).index_select(0, i.view(-1)).view(i.sizes()).masked_fill(zero, 0);
  return {q.view(-1).slice(0, 0, n), absmax};
}

torch::Tensor dequantize_blockwise_8bit(const torch::Tensor& q, const torch::Tensor& absmax,
                                        const torch::Tensor& code, int64_t blocksize) {
  return scale_blocks_(code.index_select(0, q.reshape(-1).to(torch::kInt)), absmax, blocksize);
}

torch::Tensor scale_blocks_(torch::Tensor values, const torch::Tensor& absmax, int64_t blocksize) {
  const int64_t n = values.numel();
  const int64_t rem = n % blocksize;
  const int64_t full = n - rem;
  values.slice(0, 0, full)
      .view({-1, blocksize})
      .mul_(absmax.slice(0, 0, full / blocksize).unsqueeze(1));
  if (rem > 0) values.slice(0, full).mul_(absmax[full / blocksize]);
  return values;
}

}  // namespace trainer::nn::quant
