#include "data/image/memory_images.h"

#include <torch/torch.h>

#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "data/image/image.h"
#include "util/format.h"
#include "util/random.h"

namespace trainer::data {

MemoryImages::MemoryImages(std::string name, torch::Tensor images, torch::Tensor labels,
                           ImageTransform transform)
    : name_(std::move(name)),
      images_(std::move(images)),
      labels_(std::move(labels)),
      transform_(std::move(transform)) {}

torch::Tensor MemoryImages::input_from_image(const std::vector<uint8_t>& bytes,
                                             const std::string& path) const {
  int64_t width = 0, height = 0;
  image_size(bytes, path, width, height);
  Rect region{0, 0, width, height};
  const Image image = decode_image(bytes, path, region, /*min_side=*/0);
  auto x = torch::from_blob(const_cast<uint8_t*>(image.rgb.data()), {image.height, image.width, 3},
                            torch::kUInt8)
               .permute({2, 0, 1})
               .to(torch::kFloat32);  // [3, H, W] in [0, 255]
  const int64_t c = images_.size(1), h = images_.size(2), w = images_.size(3);
  if (c == 1) {
    x = (x[0] * 0.299 + x[1] * 0.587 + x[2] * 0.114).unsqueeze(0);  // [1, H, W]
  }
  if (x.size(1) != h || x.size(2) != w) {
    namespace F = torch::nn::functional;
    x = F::interpolate(x.unsqueeze(0), F::InterpolateFuncOptions()
                                           .size(std::vector<int64_t>{h, w})
                                           .mode(torch::kBilinear)
                                           .align_corners(false)
                                           .antialias(true))[0];  // [C, h, w]
  }
  x = x.round().clamp(0, 255) / 255.0;  // the samples' byte values, scaled
  if (transform_.mean.empty()) return x;
  for (int64_t ch = 0; ch < c; ++ch) {
    const auto k = static_cast<size_t>(transform_.mean.size() == 1 ? 0 : ch);
    x[ch] = (x[ch] - transform_.mean[k]) / transform_.std[k];
  }
  return x;  // [C, h, w]
}

Batch MemoryImages::fetch(const std::vector<int64_t>& indices, const Epoch& epoch) const {
  auto idx = index_tensor(indices, size(), name_);  // [B] int64
  const int64_t b = idx.size(0), c = images_.size(1), h = images_.size(2), w = images_.size(3);
  const int64_t pad = transform_.crop_padding;
  // Per channel: x -> x * scale + shift maps a byte to its normalised value.
  std::vector<float> scale(static_cast<size_t>(c), 1.0f / 255.0f), shift(static_cast<size_t>(c));
  if (!transform_.mean.empty()) {
    for (int64_t ch = 0; ch < c; ++ch) {
      const auto k = static_cast<size_t>(transform_.mean.size() == 1 ? 0 : ch);
      scale[static_cast<size_t>(ch)] = static_cast<float>(1.0 / (255.0 * transform_.std[k]));
      shift[static_cast<size_t>(ch)] = static_cast<float>(-transform_.mean[k] / transform_.std[k]);
    }
  }
  auto out = torch::empty({b, c, h, w}, torch::kFloat32);  // [B, C, H, W]
  const auto* src = images_.data_ptr<uint8_t>();
  auto* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t n = indices[static_cast<size_t>(i)];
    // Offset of the crop window in the padded image, and the flip.
    int64_t dy = pad, dx = pad;
    bool flip = false;
    if (pad > 0 || transform_.hflip > 0) {
      Rng rng(epoch.sample_seed(n));
      if (pad > 0) {
        dy = rng.below(2 * pad + 1);
        dx = rng.below(2 * pad + 1);
      }
      flip = rng.bernoulli(transform_.hflip);
    }
    for (int64_t ch = 0; ch < c; ++ch) {
      const uint8_t* plane = src + (n * c + ch) * h * w;
      float* o = dst + (i * c + ch) * h * w;
      const float sc = scale[static_cast<size_t>(ch)], sh = shift[static_cast<size_t>(ch)];
      for (int64_t y = 0; y < h; ++y) {
        const int64_t sy = y + dy - pad;
        for (int64_t x = 0; x < w; ++x) {
          const int64_t sx = (flip ? w - 1 - x : x) + dx - pad;
          const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
          const float v = inside ? static_cast<float>(plane[sy * w + sx]) : 0.0f;
          o[y * w + x] = v * sc + sh;
        }
      }
    }
  }
  return Batch{out, labels_.index_select(0, idx)};
}

void channel_stats(const torch::Tensor& images, std::vector<double>& mean,
                   std::vector<double>& std) {
  const int64_t n = images.size(0), c = images.size(1), hw = images.size(2) * images.size(3);
  const auto* p = images.data_ptr<uint8_t>();
  mean.assign(static_cast<size_t>(c), 0.0);
  std.assign(static_cast<size_t>(c), 1.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    // A histogram of the bytes gives exact sums without floating-point accumulation error.
    std::array<int64_t, 256> hist{};
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* plane = p + (i * c + ch) * hw;
      for (int64_t j = 0; j < hw; ++j) ++hist[plane[j]];
    }
    double sum = 0.0, sum_sq = 0.0;
    for (int v = 0; v < 256; ++v) {
      const double x = v / 255.0;
      sum += x * static_cast<double>(hist[static_cast<size_t>(v)]);
      sum_sq += x * x * static_cast<double>(hist[static_cast<size_t>(v)]);
    }
    const double count = static_cast<double>(n * hw);
    const double m = sum / count;
    const double var = sum_sq / count - m * m;
    mean[static_cast<size_t>(ch)] = m;
    std[static_cast<size_t>(ch)] = var > 1e-12 ? std::sqrt(var) : 1.0;
  }
}

void check_normalisation(const config::DataConfig& cfg, int64_t channels) {
  const auto n = static_cast<int64_t>(cfg.mean.size());
  if (n > 1 && n != channels) {
    throw std::invalid_argument("data.mean: " + std::to_string(n) + " entries for " +
                                std::to_string(channels) +
                                "-channel images; give one per channel or a single value");
  }
}

ImageTransform eval_transform(const config::DataConfig& cfg, const std::vector<double>& mean,
                              const std::vector<double>& std) {
  ImageTransform t;
  if (cfg.normalize) {
    t.mean = cfg.mean.empty() ? mean : cfg.mean;
    t.std = cfg.mean.empty() ? std : cfg.stdev;
  }
  return t;
}

ImageTransform train_transform(const config::DataConfig& cfg, const std::vector<double>& mean,
                               const std::vector<double>& std) {
  ImageTransform t = eval_transform(cfg, mean, std);
  const auto& o = cfg.own<MemoryImageOptions>();
  t.crop_padding = o.crop_padding;
  t.hflip = o.hflip;
  return t;
}

void MemoryImageOptions::validate(config::Checks& c) const {
  c.at_least("crop_padding", crop_padding, 0);
  if (!(hflip >= 0.0 && hflip <= 1.0)) {
    c.add("hflip", "must be a probability in [0, 1], got " + format_number(hflip));
  }
}

}  // namespace trainer::data
