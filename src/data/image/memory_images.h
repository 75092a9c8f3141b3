// Images held in memory as uint8 (Fashion-MNIST, CIFAR-10), converted to normalised float per
// batch, with optional training augmentation: zero-pad and random crop, horizontal flip.
#pragma once

#include <torch/types.h>

#include <vector>

#include "config/config.h"
#include "data/dataset.h"

namespace trainer::data {

// How samples are drawn: normalisation (per channel, or one value for all) and augmentation.
struct ImageTransform {
  std::vector<double> mean;  // empty = no normalisation
  std::vector<double> std;
  int64_t crop_padding = 0;  // > 0: pad every side by this, then crop a random window
  double hflip = 0.0;        // flip probability
};

class MemoryImages final : public Dataset {
 public:
  // images: [N, C, H, W] uint8, labels: [N] int64; `name` appears in error messages.
  MemoryImages(std::string name, torch::Tensor images, torch::Tensor labels,
               ImageTransform transform);
  int64_t size() const override { return images_.size(0); }
  // Decoded, turned grey (ITU-R 601 luma, as Pillow's "L") for one channel, resized to the
  // samples' height and width, and normalised as the samples are.
  torch::Tensor input_from_image(const std::vector<uint8_t>& bytes,
                                 const std::string& path) const override;

 protected:
  Batch fetch(const std::vector<int64_t>& indices, const Epoch& epoch) const override;

 private:
  std::string name_;
  torch::Tensor images_;  // [N, C, H, W] uint8
  torch::Tensor labels_;  // [N] int64
  ImageTransform transform_;
};

// Per-channel mean and standard deviation of `images` ([N, C, H, W] uint8) scaled to [0, 1].
void channel_stats(const torch::Tensor& images, std::vector<double>& mean,
                   std::vector<double>& std);

// The `data.` keys of the in-memory image data sets (fashion_mnist, cifar10): training
// augmentation.
struct MemoryImageOptions {
  int64_t crop_padding = 0;  // zero-pad training images by this, then crop at random
  double hflip = 0.0;        // probability of flipping a training image horizontally

  template <class V>
  void visit(V& v) {
    v("crop_padding", crop_padding);
    v("hflip", hflip);
  }
  void validate(config::Checks& c) const;
};

// Throws std::invalid_argument when data.mean/std have neither 1 nor `channels` entries.
void check_normalisation(const config::DataConfig& cfg, int64_t channels);

// The transforms of the train and val splits from the data section: normalisation from
// data.mean/std when given, else `mean`/`std` (the data set's own); augmentation (the data set's
// MemoryImageOptions) on train only.
ImageTransform train_transform(const config::DataConfig& cfg, const std::vector<double>& mean,
                               const std::vector<double>& std);
ImageTransform eval_transform(const config::DataConfig& cfg, const std::vector<double>& mean,
                              const std::vector<double>& std);

}  // namespace trainer::data
