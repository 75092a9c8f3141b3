#include "data/image/image_transform.h"

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "util/format.h"
#include "util/log.h"

namespace trainer::data {
namespace {

const std::vector<double> kImagenetMean = {0.485, 0.456, 0.406};
const std::vector<double> kImagenetStd = {0.229, 0.224, 0.225};
// Unreadable images in a row (each replaced by the next one) before the run stops.
constexpr int kMaxConsecutiveBad = 16;

void check_range(config::Checks& c, const std::string& key, const std::vector<double>& r, double lo,
                 double hi) {
  if (r.size() != 2 || !(r[0] > lo && r[0] <= r[1] && r[1] <= hi)) {
    c.add(key, "must be two numbers [low, high] with " + format_number(lo) +
                   " < low <= high <= " + format_number(hi));
  }
}

}  // namespace

void ImageKeys::validate(config::Checks& c) const {
  if (!(hflip >= 0.0 && hflip <= 1.0)) {
    c.add("hflip", "must be a probability in [0, 1], got " + format_number(hflip));
  }
  c.at_least("image_size", image_size, 1);
  c.at_least("resize_size", resize_size, 1);
  c.at_least("max_image_pixels", max_image_pixels, 1);
  if (resize_size >= 1 && image_size > resize_size) {
    c.add("resize_size", "must be >= data.image_size (" + std::to_string(image_size) + "), got " +
                             std::to_string(resize_size));
  }
  check_range(c, "crop_scale", crop_scale, 0.0, 1.0);
  check_range(c, "crop_ratio", crop_ratio, 0.0, 100.0);
}

TransformOptions transform_options(const ImageKeys& keys, const config::DataConfig& data,
                                   bool train) {
  if (data.mean.size() > 1 && data.mean.size() != 3) {
    throw DataConfigError("data.mean", "give 3 entries (R, G, B) or a single value");
  }
  TransformOptions o;
  o.train = train;
  o.image_size = keys.image_size;
  o.resize_size = keys.resize_size;
  o.crop_scale = keys.crop_scale;
  o.crop_ratio = keys.crop_ratio;
  o.hflip = keys.hflip;
  o.max_pixels = keys.max_image_pixels;
  if (data.normalize) {
    o.mean = data.mean.empty() ? kImagenetMean : data.mean;
    o.std = data.mean.empty() ? kImagenetStd : data.stdev;
  }
  return o;
}

void ImageTransform::apply(const std::vector<uint8_t>& bytes, const std::string& path, Rng& rng,
                           torch::Tensor out) const {
  int64_t width = 0, height = 0;
  const auto& o = options_;
  image_size(bytes, path, width, height, o.max_pixels);
  if (!o.train) {  // torchvision's Resize + CenterCrop, on the full-size decode
    Rect whole{0, 0, width, height};
    const Image image = decode_image(bytes, path, whole, /*min_side=*/0, o.max_pixels);
    resize_center_crop(image, o.resize_size, o.image_size, std::move(out));
    return;
  }
  Rect region = random_resized_crop(width, height, o.crop_scale, o.crop_ratio, rng);
  const bool flip = rng.bernoulli(o.hflip);
  const Image image = decode_image(bytes, path, region, o.image_size, o.max_pixels);
  crop_resize(image, region, o.image_size, flip, std::move(out));
}

torch::Tensor ImageTransform::normalise(const torch::Tensor& pixels) const {
  auto x = pixels.to(torch::kFloat32);
  if (options_.mean.empty()) return x.div_(255.0);
  std::vector<float> scale(3), shift(3);
  for (size_t c = 0; c < 3; ++c) {
    const size_t k = options_.mean.size() == 1 ? 0 : c;
    scale[c] = static_cast<float>(1.0 / (255.0 * options_.std[k]));
    shift[c] = static_cast<float>(-options_.mean[k] / options_.std[k]);
  }
  auto sc = torch::tensor(scale).view({1, 3, 1, 1});
  auto sh = torch::tensor(shift).view({1, 3, 1, 1});
  return x.mul_(sc).add_(sh);
}

torch::Tensor ImageTransform::input(const std::vector<uint8_t>& bytes,
                                    const std::string& path) const {
  const int64_t s = options_.image_size;
  auto pixels = torch::empty({1, 3, s, s}, torch::kUInt8);  // [1, 3, S, S]
  Rng rng(0);
  apply(bytes, path, rng, pixels[0]);
  return normalise(pixels)[0];  // [3, S, S]
}

Batch image_batch(const std::vector<int64_t>& indices, const Epoch& epoch, int64_t size,
                  const ImageTransform& transform, bool fail, const std::string& key,
                  const LoadImage& load) {
  const auto b = static_cast<int64_t>(indices.size());
  const int64_t s = transform.options().image_size;
  auto pixels = torch::empty({b, 3, s, s}, torch::kUInt8);  // [B, 3, S, S]
  auto targets = torch::empty({b}, torch::kInt64);          // [B]
  auto* target = targets.data_ptr<int64_t>();
  Batch batch;
  for (int64_t i = 0; i < b; ++i) {
    int64_t n = indices[static_cast<size_t>(i)];
    Rng rng(epoch.sample_seed(n));
    for (int bad = 0;; ++bad) {
      try {
        target[i] = load(n, rng, pixels[i]);
        break;
      } catch (const DataError& e) {
        if (fail) throw;
        if (bad + 1 >= kMaxConsecutiveBad) {
          throw DataError(std::string(e.what()) + " (and " + std::to_string(bad) +
                          " unreadable images before it in a row; check the data set)");
        }
        log::warn(std::string(e.what()) + "; skipped (" + key + ": skip)");
        ++batch.bad_samples;
        n = (n + 1) % size;
      }
    }
  }
  batch.inputs = transform.normalise(pixels);
  batch.targets = targets;
  return batch;
}

}  // namespace trainer::data
