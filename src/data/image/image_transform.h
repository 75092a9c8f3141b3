// The image samples' transforms and their `data.` keys, shared by the data sets that read image
// files (imagefolder, webdataset): training samples get a random-resized crop (data.crop_scale,
// data.crop_ratio) to image_size and a flip with probability data.hflip; evaluation samples get
// the shorter side resized to resize_size and a center crop of image_size (torchvision's Resize +
// CenterCrop: antialiased bilinear on the full-size decode). Both normalise with data.mean/std
// (ImageNet's by default).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/dataset.h"
#include "data/image/image.h"
#include "util/random.h"

namespace trainer::data {

// The `data.` keys of the image transforms, embedded in each image data set's options.
struct ImageKeys {
  int64_t image_size = 224;                      // side of the square train and eval crops
  int64_t resize_size = 256;                     // eval resizes the shorter side to this first
  std::vector<double> crop_scale = {0.08, 1.0};  // random-resized-crop area range
  std::vector<double> crop_ratio = {0.75, 4.0 / 3.0};  // random-resized-crop aspect-ratio range
  double hflip = 0.0;  // probability of flipping a training image horizontally
  int64_t max_image_pixels = kMaxImagePixels;  // larger headers are rejected (decompression bombs)

  template <class V>
  void visit(V& v) {
    v("hflip", hflip);
    v("image_size", image_size);
    v("resize_size", resize_size);
    v("crop_scale", crop_scale);
    v("crop_ratio", crop_ratio);
    v("max_image_pixels", max_image_pixels);
  }
  void validate(config::Checks& c) const;
};

struct TransformOptions {
  bool train = false;        // random-resized crop and flip; else resize + center crop
  int64_t image_size = 224;  // output side
  int64_t resize_size = 256;
  std::vector<double> crop_scale, crop_ratio;
  double hflip = 0.0;
  int64_t max_pixels = kMaxImagePixels;  // headers claiming more are rejected
  std::vector<double> mean, std;         // empty = only scale to [0, 1]
};

// The transform options of the training (`train`) or evaluation split from the image keys and the
// data section's normalisation (data.normalize, data.mean, data.std). Throws DataConfigError for a
// data.mean that is neither one value nor three.
TransformOptions transform_options(const ImageKeys& keys, const config::DataConfig& data,
                                   bool train);

class ImageTransform {
 public:
  explicit ImageTransform(TransformOptions options) : options_(std::move(options)) {}

  const TransformOptions& options() const { return options_; }

  // One image file's `bytes` transformed into `out` ([3, S, S] uint8), drawing the crop and flip
  // from `rng`. Throws DataError naming `path` for an unreadable image.
  void apply(const std::vector<uint8_t>& bytes, const std::string& path, Rng& rng,
             torch::Tensor out) const;

  // [B, 3, S, S] uint8 -> float32, scaled to [0, 1] and normalised per channel.
  torch::Tensor normalise(const torch::Tensor& pixels) const;

  // The model input [3, S, S] float32 of one image file (Dataset::input_from_image).
  torch::Tensor input(const std::vector<uint8_t>& bytes, const std::string& path) const;

 private:
  TransformOptions options_;
};

// Reads and transforms sample n's image into `out` ([3, S, S] uint8) with the sample's `rng` and
// returns its label; throws DataError for an unreadable one.
using LoadImage = std::function<int64_t(int64_t n, Rng& rng, torch::Tensor out)>;

// The batch of image samples `indices` (each in [0, size)): sample n's pixels and label from
// `load`, drawn with the generator of epoch.sample_seed(n). An unreadable sample stops the batch
// with its DataError when `fail`, else is replaced by the next sample (warned, naming the setting
// `key` that chose to skip, and counted in Batch::bad_samples), up to 16 in a row.
Batch image_batch(const std::vector<int64_t>& indices, const Epoch& epoch, int64_t size,
                  const ImageTransform& transform, bool fail, const std::string& key,
                  const LoadImage& load);

}  // namespace trainer::data
