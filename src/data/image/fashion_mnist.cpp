// The `fashion_mnist` dataset: the four IDX files of Fashion-MNIST (raw or gzip-compressed),
// held in memory as uint8 and converted to float per batch, with optional pad-and-crop and flip.
#include <torch/torch.h>

#include <cstring>
#include <string>
#include <utility>

#include "data/dataset.h"
#include "data/image/idx.h"
#include "data/image/memory_images.h"
#include "text/files.h"

namespace trainer::data {
namespace {

constexpr const char* kDefaultRoot = "/usr/share/datasets/fashion-mnist";
constexpr const char* kHint = "install the Debian package dataset-fashion-mnist or set data.root";
constexpr int64_t kNumClasses = 10;

// `dir/base.gz`, else `dir/base`; DataError naming both when neither exists.
std::string find_file(const std::string& dir, const std::string& base) {
  const std::string raw = dir + "/" + base;
  const std::string gz = raw + ".gz";
  if (is_file(gz)) return gz;
  if (is_file(raw)) return raw;
  throw DataError(dir + ": missing " + base + "(.gz) (tried " + gz + " and " + raw + "); " + kHint);
}

IdxArray read(const std::string& path) {
  try {
    return read_idx(path);
  } catch (const IdxError& e) {
    throw DataError(e.what());
  }
}

struct Split {
  torch::Tensor images;  // [N, 1, H, W] uint8
  torch::Tensor labels;  // [N] int64
};

Split load_split(const std::string& dir, const std::string& prefix) {
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  IdxArray images = read(images_path);
  IdxArray labels = read(labels_path);
  if (images.type != IdxType::kUInt8 || images.dims.size() != 3) {
    throw DataError(images_path + ": expected 3-D unsigned byte images, found " +
                    std::to_string(images.dims.size()) + "-D of type code " +
                    std::to_string(static_cast<int>(images.type)));
  }
  if (labels.type != IdxType::kUInt8 || labels.dims.size() != 1) {
    throw DataError(labels_path + ": expected 1-D unsigned byte labels, found " +
                    std::to_string(labels.dims.size()) + "-D of type code " +
                    std::to_string(static_cast<int>(labels.type)));
  }
  const int64_t n = images.dims[0];
  const int64_t h = images.dims[1];
  const int64_t w = images.dims[2];
  if (n == 0 || h == 0 || w == 0) throw DataError(images_path + ": no images");
  if (labels.dims[0] != n) {
    throw DataError(labels_path + ": " + std::to_string(labels.dims[0]) + " labels for " +
                    std::to_string(n) + " images in " + images_path);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (labels.data[i] >= kNumClasses) {
      throw DataError(labels_path + ": label " + std::to_string(labels.data[i]) + " at index " +
                      std::to_string(i) + " is not below " + std::to_string(kNumClasses));
    }
  }
  Split split;
  split.images = torch::empty({n, 1, h, w}, torch::kUInt8);
  std::memcpy(split.images.data_ptr<uint8_t>(), images.data.data(), images.data.size());
  split.labels = torch::empty({n}, torch::kUInt8);
  std::memcpy(split.labels.data_ptr<uint8_t>(), labels.data.data(), labels.data.size());
  split.labels = split.labels.to(torch::kInt64);
  return split;
}

Splits make_fashion_mnist(const config::DataConfig& cfg, const DataContext& /*ctx*/) {
  const std::string dir = strip_slashes(cfg.root.empty() ? std::string(kDefaultRoot) : cfg.root);
  if (!is_directory(dir)) {
    throw DataConfigError("data.root", dir +
                                           ": no such directory (looking for "
                                           "train-images-idx3-ubyte.gz); " +
                                           kHint);
  }
  Split train = load_split(dir, "train");
  Split val = load_split(dir, "t10k");
  if (val.images.size(2) != train.images.size(2) || val.images.size(3) != train.images.size(3)) {
    throw DataError(dir + ": t10k images are " + std::to_string(val.images.size(2)) + "x" +
                    std::to_string(val.images.size(3)) + " but train images are " +
                    std::to_string(train.images.size(2)) + "x" +
                    std::to_string(train.images.size(3)));
  }
  std::vector<double> mean, std;
  channel_stats(train.images, mean, std);
  check_normalisation(cfg, /*channels=*/1);
  Splits splits;
  splits.spec.sample_shape = {1, train.images.size(2), train.images.size(3)};
  splits.spec.num_classes = kNumClasses;
  splits.spec.class_names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                             "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  splits.train =
      std::make_shared<MemoryImages>("fashion_mnist", std::move(train.images),
                                     std::move(train.labels), train_transform(cfg, mean, std));
  splits.val =
      std::make_shared<MemoryImages>("fashion_mnist", std::move(val.images), std::move(val.labels),
                                     eval_transform(cfg, mean, std));
  return splits;
}

}  // namespace

void register_fashion_mnist(DatasetRegistry& registry) {
  registry.add("fashion_mnist", make_fashion_mnist, config::options_of<MemoryImageOptions>());
}

}  // namespace trainer::data
