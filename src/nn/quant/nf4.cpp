#include "nn/quant/nf4.h"

#include "nn/fused/fused_launch.h"
#include "nn/quant/nf4_kernel.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "nn/quant/blockwise.h"

namespace trainer::nn::quant {
namespace {

using torch::indexing::None;

bool valid_blocksize(int64_t b) {
  return b >= 32 && b <= 4096 && (b & (b - 1)) == 0;
}

// Elements quantized or dequantized at a time (a multiple of every block size): temporaries stay
// under ~16 bytes times this, whatever the weight's size. Blocks are independent, so the chunks'
// results are the whole tensor's.
constexpr int64_t kChunk = int64_t{1} << 22;

// The packed 4-bit codes of `a` (float32, flat) and each block's absmax: the scaled values
// bucketized against the NF4 midpoints, as bitsandbytes' default quantize_4bit does. `a` is a
// chunk of whole blocks, the last chunk's last block possibly ragged.
std::pair<torch::Tensor, torch::Tensor> nf4_chunk(const torch::Tensor& a, int64_t blocksize,
                                                  const torch::Tensor& bounds) {
  const int64_t n = a.numel();
  const int64_t rem = n % blocksize;
  const int64_t full = n - rem;
  const torch::Tensor whole = a.slice(0, 0, full).view({-1, blocksize});
  torch::Tensor absmax = whole.abs().amax(1);
  torch::Tensor scaled =
      (whole * absmax.clamp_min(1e-38).reciprocal().view({-1, 1})).clamp_(-1, 1).view(-1);
  if (rem > 0) {
    const torch::Tensor tail = a.slice(0, full);
    const torch::Tensor am = tail.abs().max().clamp_min(1e-38);
    absmax = torch::cat({absmax, am.view(1)});
    scaled = torch::cat({scaled, (tail / am).clamp_(-1, 1)});
  }
  if (scaled.numel() % 2 == 1) scaled = torch::constant_pad_nd(scaled, {0, 1});
  const torch::Tensor q = torch::bucketize(scaled, bounds, /*out_int32=*/true).to(torch::kUInt8);
  return {q.slice(0, 0, None, 2).bitwise_left_shift(4).bitwise_or_(q.slice(0, 1, None, 2)), absmax};
}

// nf4_chunk over `w` flattened, chunk by chunk: packed [(n + 1) / 2, 1] and absmax [blocks].
std::pair<torch::Tensor, torch::Tensor> nf4_codes(const torch::Tensor& w, int64_t blocksize) {
  const torch::Tensor flat = w.reshape(-1);
  const int64_t n = flat.numel();
  const torch::Tensor code = nf4_code(w.device());
  const torch::Tensor bounds = (code.slice(0, 0, 15) + code.slice(0, 1, 16)) / 2;
  torch::Tensor packed = torch::empty(
      {(n + 1) / 2, 1}, torch::TensorOptions().dtype(torch::kUInt8).device(w.device()));
  torch::Tensor absmax =
      torch::empty({(n + blocksize - 1) / blocksize},
                   torch::TensorOptions().dtype(torch::kFloat).device(w.device()));
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = std::min(n, start + kChunk);
    const torch::Tensor chunk = flat.slice(0, start, end).to(torch::kFloat);
    if (!torch::isfinite(chunk).all().item<bool>())
      throw std::invalid_argument("NF4 quantization of a tensor holding inf or NaN");
    auto [p, a] = nf4_chunk(chunk, blocksize, bounds);
    packed.view(-1).slice(0, start / 2, start / 2 + p.numel()).copy_(p);
    absmax.slice(0, start / blocksize, start / blocksize + a.numel()).copy_(a);
  }
  return {packed, absmax};
}

// Pairs of values for each byte: row b holds (table[b >> 4], table[b & 15]).
torch::Tensor byte_pairs(const torch::Tensor& table) {
  const torch::Tensor b = torch::arange(256, torch::TensorOptions().device(table.device()));
  return torch::stack(
      {table.index_select(0, b.bitwise_right_shift(4)), table.index_select(0, b.bitwise_and(15))},
      1);
}

void check_input(const torch::Tensor& w, int64_t blocksize) {
  if (!w.defined() || w.numel() == 0)
    throw std::invalid_argument("NF4 quantization of an empty tensor");
  const auto t = w.scalar_type();
  if (t != torch::kFloat && t != torch::kBFloat16 && t != torch::kHalf)
    throw std::invalid_argument(
        std::string("NF4 quantization needs a float32, bfloat16 or float16 tensor, not ") +
        c10::toString(t));
  if (!valid_blocksize(blocksize))
    throw std::invalid_argument("NF4 block size " + std::to_string(blocksize) +
                                ": use a power of two from 32 to 4096 (64 is QLoRA's)");
}

#ifdef TRAINER_WITH_CUDA
// dequantize on a CUDA device: one launch of nn/quant/nf4_cuda.cu's kernel.
torch::Tensor dequantize_cuda(const Nf4Weight& w, torch::ScalarType out) {
  auto result = torch::empty({w.numel()}, w.packed.options().dtype(out));  // [numel]
  Nf4DequantizeArgs a;
  a.packed = w.packed.data_ptr<uint8_t>();
  a.code = w.code.data_ptr<float>();
  if (w.nested()) {
    a.absmax_q = w.absmax.data_ptr<uint8_t>();
    a.nested_absmax = w.nested_absmax.data_ptr<float>();
    a.nested_code = w.nested_code.data_ptr<float>();
    a.offset = w.offset.data_ptr<float>();
    a.nested_blocksize = w.nested_blocksize;
  } else {
    a.absmax = w.absmax.data_ptr<float>();
  }
  a.out = result.data_ptr();
  a.numel = w.numel();
  a.blocksize = w.blocksize;
  a.dtype = fused_dtype_of(result);
  run_kernel(&launch_nf4_dequantize, a, result, "NF4 dequantization");
  return result.view(w.shape);
}
#endif

}  // namespace

torch::Tensor nf4_code(const torch::Device& device) {
  static const float values[16] = {-1.0f,
                                   -0.6961928009986877f,
                                   -0.5250730514526367f,
                                   -0.39491748809814453f,
                                   -0.28444138169288635f,
                                   -0.18477343022823334f,
                                   -0.09105003625154495f,
                                   0.0f,
                                   0.07958029955625534f,
                                   0.16093020141124725f,
                                   0.24611230194568634f,
                                   0.33791524171829224f,
                                   0.44070982933044434f,
                                   0.5626170039176941f,
                                   0.7229568362236023f,
                                   1.0f};
  return torch::from_blob(const_cast<float*>(values), {16}, torch::kFloat).clone().to(device);
}

torch::Tensor dynamic_code(const torch::Device& device) {
  // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for i = 0..6 the
  // means of 2^i + 1 linspace(0.1, 1) boundaries times 10^(i - 6), both signs, then 0 and 1.
  std::vector<torch::Tensor> parts;
  for (int i = 0; i < 7; ++i) {
    const torch::Tensor b = torch::linspace(0.1, 1, (1 << i) + 1, torch::kFloat);
    const torch::Tensor means = (b.slice(0, 0, -1) + b.slice(0, 1)) / 2.0;
    const double scale = std::pow(10.0, i - 6);
    parts.push_back(means * scale);
    parts.push_back(means * -scale);
  }
  parts.push_back(torch::tensor({0.0f, 1.0f}));
  return std::get<0>(torch::cat(parts).sort()).to(device);
}

int64_t Nf4Weight::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Nf4Weight::held_bytes() const {
  int64_t bytes = 0;
  for (const torch::Tensor* t : {&packed, &absmax, &nested_absmax, &nested_code, &offset, &code})
    if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  return bytes;
}

Nf4Weight Nf4Weight::to(const torch::Device& device) const {
  Nf4Weight w = *this;
  for (torch::Tensor* t :
       {&w.packed, &w.absmax, &w.nested_absmax, &w.nested_code, &w.offset, &w.code})
    if (t->defined()) *t = t->to(device);
  return w;
}

Nf4Weight quantize_nf4(const torch::Tensor& w, int64_t blocksize, bool double_quant) {
  check_input(w, blocksize);
  auto [packed, absmax] = nf4_codes(w, blocksize);
  Nf4Weight out;
  out.packed = packed;
  out.code = nf4_code(w.device());
  out.blocksize = blocksize;
  out.shape = w.sizes().vec();
  out.dtype = w.scalar_type();
  if (!double_quant) {
    out.absmax = absmax;
    return out;
  }
  out.offset = absmax.mean();
  out.nested_code = dynamic_code(w.device());
  auto [qa, nested_absmax] =
      quantize_blockwise_8bit(absmax - out.offset, out.nested_code, out.nested_blocksize);
  out.absmax = qa;
  out.nested_absmax = nested_absmax;
  return out;
}

torch::Tensor restore_absmax(const Nf4Weight& w) {
  if (!w.nested()) return w.absmax;
  return dequantize_blockwise_8bit(w.absmax, w.nested_absmax, w.nested_code, w.nested_blocksize) +
         w.offset;
}

torch::Tensor dequantize(const Nf4Weight& w, torch::ScalarType out) {
  if (out != torch::kFloat && out != torch::kBFloat16 && out != torch::kHalf)
    throw std::invalid_argument(std::string("NF4 dequantization into ") + c10::toString(out) +
                                ": use float32, bfloat16 or float16");
#ifdef TRAINER_WITH_CUDA
  if (w.packed.is_cuda()) return dequantize_cuda(w, out);
#endif
  const int64_t n = w.numel();
  const torch::Tensor absmax = restore_absmax(w);
  const torch::Tensor pairs = byte_pairs(w.code);
  const torch::Tensor bytes = w.packed.view(-1);
  torch::Tensor result =
      torch::empty({n}, torch::TensorOptions().dtype(out).device(bytes.device()));
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = std::min(n, start + kChunk);
    const torch::Tensor codes = bytes.slice(0, start / 2, (end + 1) / 2).to(torch::kInt);
    torch::Tensor values = pairs.index_select(0, codes).view(-1).slice(0, 0, end - start);
    const int64_t first = start / w.blocksize;
    values = scale_blocks_(values, absmax.slice(0, first), w.blocksize);
    result.slice(0, start, end).copy_(values);  // one rounding to `out`, to nearest even
  }
  return result.view(w.shape);
}

}  // namespace trainer::nn::quant
