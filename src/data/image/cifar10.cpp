// The `cifar10` dataset: CIFAR-10's binary version (data_batch_1.bin .. data_batch_5.bin,
// test_batch.bin; records of one label byte and a 3x32x32 image in planar RGB), held in memory,
// with optional pad-and-crop and flip (the usual recipe: crop_padding 4, hflip 0.5).
#include <torch/torch.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "data/image/memory_images.h"
#include "text/files.h"

namespace trainer::data {
namespace {

constexpr int64_t kSide = 32;
constexpr int64_t kChannels = 3;
constexpr int64_t kImageBytes = kChannels * kSide * kSide;
constexpr int64_t kRecordBytes = 1 + kImageBytes;
constexpr int64_t kNumClasses = 10;

struct Split {
  torch::Tensor images;  // [N, 3, 32, 32] uint8
  torch::Tensor labels;  // [N] int64
};

Split load(const std::string& dir, const std::vector<std::string>& files) {
  std::vector<std::vector<uint8_t>> contents;
  int64_t n = 0;
  for (const auto& name : files) {
    const std::string path = dir + "/" + name;
    if (!is_file(path)) {
      throw DataError(path +
                      ": missing (the CIFAR-10 binary version has data_batch_1.bin .. "
                      "data_batch_5.bin and test_batch.bin)");
    }
    contents.push_back(read_file(path));
    const auto size = static_cast<int64_t>(contents.back().size());
    if (size == 0 || size % kRecordBytes != 0) {
      throw DataError(path + ": " + std::to_string(size) +
                      " bytes is not a whole number of CIFAR-10 records of " +
                      std::to_string(kRecordBytes) +
                      " bytes; the file is truncated or not "
                      "CIFAR-10's binary version");
    }
    n += size / kRecordBytes;
  }
  Split split;
  split.images = torch::empty({n, kChannels, kSide, kSide}, torch::kUInt8);
  split.labels = torch::empty({n}, torch::kInt64);
  auto* img = split.images.data_ptr<uint8_t>();
  auto* lab = split.labels.data_ptr<int64_t>();
  int64_t i = 0;
  for (size_t f = 0; f < contents.size(); ++f) {
    const auto& bytes = contents[f];
    for (size_t off = 0; off < bytes.size(); off += kRecordBytes, ++i) {
      if (bytes[off] >= kNumClasses) {
        throw DataError(dir + "/" + files[f] + ": label " + std::to_string(bytes[off]) +
                        " of record " + std::to_string(off / kRecordBytes) + " is not below 10");
      }
      lab[i] = bytes[off];
      std::memcpy(img + i * kImageBytes, bytes.data() + off + 1, kImageBytes);
    }
  }
  return split;
}

Splits make_cifar10(const config::DataConfig& cfg, const DataContext& /*ctx*/) {
  if (cfg.root.empty()) {
    throw DataConfigError("data.root",
                          "set it to the folder of CIFAR-10's binary version "
                          "(cifar-10-batches-bin, with data_batch_1.bin .. test_batch.bin)");
  }
  std::string dir = strip_slashes(cfg.root);
  if (!is_directory(dir)) throw DataConfigError("data.root", dir + ": no such directory");
  // The archive unpacks into cifar-10-batches-bin/; accept its parent too.
  if (!is_file(dir + "/data_batch_1.bin") && is_directory(dir + "/cifar-10-batches-bin")) {
    dir += "/cifar-10-batches-bin";
  }
  Split train = load(dir, {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                           "data_batch_4.bin", "data_batch_5.bin"});
  Split val = load(dir, {"test_batch.bin"});
  check_normalisation(cfg, kChannels);
  std::vector<double> mean, std;
  channel_stats(train.images, mean, std);
  Splits splits;
  splits.spec.sample_shape = {kChannels, kSide, kSide};
  splits.spec.num_classes = kNumClasses;
  splits.spec.class_names = {"airplane", "automobile", "bird",  "cat",  "deer",
                             "dog",      "frog",       "horse", "ship", "truck"};
  splits.train = std::make_shared<MemoryImages>(
      "cifar10", std::move(train.images), std::move(train.labels), train_transform(cfg, mean, std));
  splits.val = std::make_shared<MemoryImages>(
      "cifar10", std::move(val.images), std::move(val.labels), eval_transform(cfg, mean, std));
  return splits;
}

}  // namespace

void register_cifar10(DatasetRegistry& registry) {
  registry.add("cifar10", make_cifar10, config::options_of<MemoryImageOptions>());
}

}  // namespace trainer::data
