// Helper of tests/preprocess_check.py: the pixels that imagefolder's transforms make.
//
//   preprocess_tool ROOT IMAGE_SIZE RESIZE_SIZE OUT.safetensors
//
// Builds the imagefolder data set on ROOT (train/ and val/, ImageNet's normalisation) and writes
// to OUT:
//   val      [N, 3, S, S] float32: the validation split, in order (Resize + CenterCrop, normalised)
//   train    [M, 3, S, S] uint8: each file of train/ (sorted) through a random-resized crop drawn
//            with Rng(i) and flipped when i is odd, decoded at full size
//   regions  [M, 5] int64: that crop's x, y, width, height and the flip
// Exit 1 with a message on any problem.
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "data/dataset.h"
#include "data/image/image.h"
#include "text/files.h"
#include "util/fileio.h"
#include "util/random.h"

namespace {

using namespace trainer;
namespace fs = std::filesystem;

// train/'s image files, sorted by path, as the data set lists them.
std::vector<std::string> train_files(const std::string& root) {
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(root + "/train")) {
    if (e.is_regular_file()) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The deterministic part of the training transform: crop, resize and flip of a given region.
void train_pixels(const std::string& root, int64_t size, torch::Tensor& pixels,
                  torch::Tensor& regions) {
  const auto files = train_files(root);
  const auto n = static_cast<int64_t>(files.size());
  pixels = torch::empty({n, 3, size, size}, torch::kUInt8);  // [M, 3, S, S]
  regions = torch::empty({n, 5}, torch::kInt64);             // [M, 5]
  for (int64_t i = 0; i < n; ++i) {
    const auto bytes = data::read_file(files[static_cast<size_t>(i)]);
    int64_t width = 0, height = 0;
    data::image_size(bytes, files[static_cast<size_t>(i)], width, height);
    Rng rng(static_cast<uint64_t>(i));
    data::Rect region =
        data::random_resized_crop(width, height, {0.08, 1.0}, {0.75, 4.0 / 3.0}, rng);
    const bool flip = i % 2 == 1;
    const auto r = region;
    const auto image = data::decode_image(bytes, files[static_cast<size_t>(i)], region,
                                          /*min_side=*/0);
    data::crop_resize(image, region, size, flip, pixels[i]);
    regions[i] = torch::tensor({r.x, r.y, r.width, r.height, int64_t{flip}});
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: preprocess_tool ROOT IMAGE_SIZE RESIZE_SIZE OUT.safetensors\n";
    return 2;
  }
  try {
    config::DataConfig cfg = data::default_data_config("imagefolder");
    cfg.root = argv[1];
    cfg.on_error = "fail";
    cfg.options.set("image_size", int64_t{std::atoll(argv[2])});
    cfg.options.set("resize_size", int64_t{std::atoll(argv[3])});
    const auto splits = data::dataset_registry().get("imagefolder")(cfg, data::DataContext{});
    std::vector<int64_t> all(static_cast<size_t>(splits.val->size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    const auto val = splits.val->get(all).inputs;
    torch::Tensor train, regions;
    train_pixels(argv[1], std::atoll(argv[2]), train, regions);
    write_atomically(argv[4], [&](const ByteSink& sink) {
      checkpoint::write_safetensors({{"val", val}, {"train", train}, {"regions", regions}}, {},
                                    sink);
    });
  } catch (const std::exception& e) {
    std::cerr << "preprocess_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
