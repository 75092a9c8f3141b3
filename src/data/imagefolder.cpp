// The `imagefolder` dataset: torchvision's ImageFolder layout, root/<train_dir>/<class>/**/image
// and root/<val_dir>/<class>/**/image, JPEG or PNG. Classes are the sub-folder names sorted
// (so class indices agree with torchvision's), files are found recursively and sorted.
//
// Training samples: random-resized crop (data.crop_scale, data.crop_ratio) to image_size, flip
// with probability data.hflip; evaluation: shorter side to resize_size, center crop image_size
// (torchvision's Resize + CenterCrop: antialiased bilinear on the full-size decode). Without
// val_dir, a seeded data.val_fraction of each class of train_dir validates. Both normalise with
// data.mean/std (ImageNet's by default).
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "data/files.h"
#include "data/image.h"
#include "util/format.h"
#include "util/log.h"
#include "util/random.h"

namespace trainer::data {
namespace {

const std::vector<double> kImagenetMean = {0.485, 0.456, 0.406};
const std::vector<double> kImagenetStd = {0.229, 0.224, 0.225};
// Unreadable images in a row (each replaced by the next one) before the run stops.
constexpr int kMaxConsecutiveBad = 16;

// The lower-case extension of a file name ("" without one).
std::string extension_of(const std::string& name) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return "";
  std::string ext = name.substr(dot + 1);
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

bool has_image_extension(const std::string& ext) {
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

// Image formats that are found but not decoded: counted and named in one log line.
bool is_other_image(const std::string& ext) {
  return ext == "webp" || ext == "bmp" || ext == "gif" || ext == "tif" || ext == "tiff";
}

// Image files under `dir`, recursively, in sorted order; `skipped` counts the images of other
// formats by extension.
void find_images(const std::string& dir, std::vector<std::string>& out,
                 std::map<std::string, int64_t>& skipped) {
  for (const auto& name : list_dir(dir)) {
    const std::string path = dir + "/" + name;
    const std::string ext = extension_of(name);
    if (is_directory(path)) {
      find_images(path, out, skipped);
    } else if (has_image_extension(ext) && is_file(path)) {
      out.push_back(path);
    } else if (is_other_image(ext)) {
      ++skipped[ext];
    }
  }
}

// One line naming the image files of formats that are not read, e.g. "3 .webp, 1 .bmp".
void log_skipped(const std::string& dir, const std::map<std::string, int64_t>& skipped) {
  if (skipped.empty()) return;
  std::string counts;
  for (const auto& [ext, n] : skipped) {
    counts += (counts.empty() ? "" : ", ") + std::to_string(n) + " ." + ext;
  }
  log::warn(dir + ": skipped " + counts +
            " files: imagefolder reads JPEG and PNG; convert them to use them");
}

struct Index {
  std::vector<std::string> classes;  // sorted class names
  std::vector<std::string> paths;    // every image
  std::vector<int64_t> labels;       // its class index
};

// Scans `dir`. `classes` given: the class folders must be among them (the validation split
// uses the training split's class indices).
Index scan(const std::string& dir, const std::vector<std::string>* classes) {
  Index index;
  for (const auto& name : list_dir(dir)) {
    if (is_directory(dir + "/" + name)) index.classes.push_back(name);
  }
  if (index.classes.empty()) {
    throw DataError(dir +
                    ": no class folders; an image folder holds one sub-folder of images "
                    "per class (" +
                    dir + "/<class>/<image>.jpg)");
  }
  std::map<std::string, int64_t> label_of, skipped;
  const auto& names = classes ? *classes : index.classes;
  for (size_t i = 0; i < names.size(); ++i) label_of[names[i]] = static_cast<int64_t>(i);
  for (const auto& cls : index.classes) {
    auto it = label_of.find(cls);
    if (it == label_of.end()) {
      throw DataError(dir + "/" + cls + ": class '" + cls +
                      "' is not among the training split's classes");
    }
    const size_t before = index.paths.size();
    find_images(dir + "/" + cls, index.paths, skipped);
    if (index.paths.size() == before) {
      throw DataError(dir + "/" + cls + ": no images (.jpg, .jpeg or .png) in this class folder");
    }
    index.labels.resize(index.paths.size(), it->second);
  }
  log_skipped(dir, skipped);
  if (classes) index.classes = *classes;
  return index;
}

// Moves a seeded `fraction` of each class's images of `train` into a validation index (at least
// one per class that has two or more), keeping the sorted order within each part.
Index split_off(Index& train, double fraction, int64_t seed) {
  Index val, kept;
  val.classes = kept.classes = train.classes;
  std::map<int64_t, std::vector<size_t>> by_class;
  for (size_t i = 0; i < train.paths.size(); ++i) by_class[train.labels[i]].push_back(i);
  std::vector<bool> held(train.paths.size(), false);
  Rng rng(static_cast<uint64_t>(seed) ^ 0x696d616765666f6cULL);
  for (auto& [label, members] : by_class) {
    const auto n = static_cast<int64_t>(members.size());
    int64_t take = std::llround(fraction * static_cast<double>(n));
    take = std::clamp<int64_t>(take, n >= 2 ? 1 : 0, n - 1);
    for (int64_t k = 0; k < take; ++k) {  // a partial Fisher-Yates shuffle
      std::swap(members[static_cast<size_t>(k)],
                members[static_cast<size_t>(k + rng.below(n - k))]);
      held[members[static_cast<size_t>(k)]] = true;
    }
  }
  for (size_t i = 0; i < train.paths.size(); ++i) {
    Index& to = held[i] ? val : kept;
    to.paths.push_back(train.paths[i]);
    to.labels.push_back(train.labels[i]);
  }
  train = std::move(kept);
  return val;
}

struct FolderOptions {
  bool train = false;        // random-resized crop and flip; else resize + center crop
  int64_t image_size = 224;  // output side
  int64_t resize_size = 256;
  std::vector<double> crop_scale, crop_ratio;
  double hflip = 0.0;
  int64_t max_pixels = kMaxImagePixels;  // headers claiming more are rejected
  bool fail_on_error = false;
  std::vector<double> mean, std;  // empty = only scale to [0, 1]
};

class ImageFolder final : public Dataset {
 public:
  ImageFolder(Index index, FolderOptions options)
      : index_(std::move(index)), options_(std::move(options)) {}

  int64_t size() const override { return static_cast<int64_t>(index_.paths.size()); }

  torch::Tensor input_from_image(const std::vector<uint8_t>& bytes,
                                 const std::string& path) const override {
    const int64_t s = options_.image_size;
    auto pixels = torch::empty({1, 3, s, s}, torch::kUInt8);  // [1, 3, S, S]
    Rng rng(0);
    transform(bytes, path, rng, pixels[0]);
    return normalise(pixels)[0];  // [3, S, S]
  }

 protected:
  Batch fetch(const std::vector<int64_t>& indices, const Epoch& epoch) const override {
    check_indices(indices, size(), "imagefolder");
    const auto b = static_cast<int64_t>(indices.size());
    const int64_t s = options_.image_size;
    auto pixels = torch::empty({b, 3, s, s}, torch::kUInt8);  // [B, 3, S, S]
    auto labels = torch::empty({b}, torch::kInt64);           // [B]
    Batch batch;
    for (int64_t i = 0; i < b; ++i) {
      int64_t n = indices[static_cast<size_t>(i)];
      Rng rng(epoch.sample_seed(n));
      for (int bad = 0;; ++bad) {
        try {
          load(n, rng, pixels[i]);
          break;
        } catch (const DataError& e) {
          if (options_.fail_on_error) throw;
          if (bad + 1 >= kMaxConsecutiveBad) {
            throw DataError(std::string(e.what()) + " (and " + std::to_string(bad) +
                            " unreadable images before it in a row; check the data set)");
          }
          log::warn(std::string(e.what()) + "; skipped (data.on_error: skip)");
          ++batch.bad_samples;
          n = (n + 1) % size();
        }
      }
      labels[i] = index_.labels[static_cast<size_t>(n)];
    }
    batch.inputs = normalise(pixels);
    batch.targets = labels;
    return batch;
  }

 private:
  // Decodes sample n and writes its transformed pixels to `out` ([3, S, S] uint8).
  void load(int64_t n, Rng& rng, torch::Tensor out) const {
    const std::string& path = index_.paths[static_cast<size_t>(n)];
    transform(read_file(path), path, rng, std::move(out));
  }

  // The split's transform of one image file's bytes into `out` ([3, S, S] uint8).
  void transform(const std::vector<uint8_t>& bytes, const std::string& path, Rng& rng,
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

  // [B, 3, S, S] uint8 -> float32, scaled to [0, 1] and normalised per channel.
  torch::Tensor normalise(const torch::Tensor& pixels) const {
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

  Index index_;
  FolderOptions options_;
};

// The `data.` keys of imagefolder.
struct ImageFolderOptions {
  std::string train_dir = "train";               // training sub-folder of data.root
  std::string val_dir = "val";                   // validation sub-folder of data.root
  int64_t image_size = 224;                      // side of the square train and eval crops
  int64_t resize_size = 256;                     // eval resizes the shorter side to this first
  std::vector<double> crop_scale = {0.08, 1.0};  // random-resized-crop area range
  std::vector<double> crop_ratio = {0.75, 4.0 / 3.0};  // random-resized-crop aspect-ratio range
  double hflip = 0.0;  // probability of flipping a training image horizontally
  int64_t max_image_pixels = kMaxImagePixels;  // larger headers are rejected (decompression bombs)
  double val_fraction = 0.1;  // without val_dir: the seeded share of train_dir that validates

  template <class V>
  void visit(V& v) {
    v("hflip", hflip);
    v("val_fraction", val_fraction);
    v("train_dir", train_dir);
    v("val_dir", val_dir);
    v("image_size", image_size);
    v("resize_size", resize_size);
    v("crop_scale", crop_scale);
    v("crop_ratio", crop_ratio);
    v("max_image_pixels", max_image_pixels);
  }
  void validate(config::Checks& c) const {
    if (!(hflip >= 0.0 && hflip <= 1.0)) {
      c.add("hflip", "must be a probability in [0, 1], got " + format_number(hflip));
    }
    c.at_least("image_size", image_size, 1);
    c.at_least("resize_size", resize_size, 1);
    c.at_least("max_image_pixels", max_image_pixels, 1);
    if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
      c.add("val_fraction", "must be in (0, 1), got " + format_number(val_fraction));
    }
    if (resize_size >= 1 && image_size > resize_size) {
      c.add("resize_size", "must be >= data.image_size (" + std::to_string(image_size) + "), got " +
                               std::to_string(resize_size));
    }
    check_range(c, "crop_scale", crop_scale, 0.0, 1.0);
    check_range(c, "crop_ratio", crop_ratio, 0.0, 100.0);
  }
  static void check_range(config::Checks& c, const std::string& key, const std::vector<double>& r,
                          double lo, double hi) {
    if (r.size() != 2 || !(r[0] > lo && r[0] <= r[1] && r[1] <= hi)) {
      c.add(key, "must be two numbers [low, high] with " + format_number(lo) +
                     " < low <= high <= " + format_number(hi));
    }
  }
};

Splits make_imagefolder(const config::DataConfig& data, const DataContext& ctx) {
  const auto& cfg = data.own<ImageFolderOptions>();
  const std::string layout = "expected " + cfg.train_dir + "/<class>/<image> (and " + cfg.val_dir +
                             "/<class>/<image>) under it";
  if (data.root.empty())
    throw DataConfigError("data.root", "set it to the image folder; " + layout);
  const std::string root = strip_slashes(data.root);
  if (!is_directory(root)) throw DataConfigError("data.root", root + ": no such directory");
  const std::string train_dir = root + "/" + cfg.train_dir;
  const std::string val_dir = root + "/" + cfg.val_dir;
  if (!is_directory(train_dir)) {
    throw DataConfigError("data.train_dir", train_dir + ": no such directory; " + layout);
  }
  const bool split = !is_directory(val_dir);
  if (data.mean.size() > 1 && data.mean.size() != 3) {
    throw DataConfigError("data.mean", "give 3 entries (R, G, B) or a single value");
  }
  Index train = scan(train_dir, nullptr);
  Index val = split ? split_off(train, cfg.val_fraction, ctx.seed) : scan(val_dir, &train.classes);
  if (split) {
    log::warn(
        strprintf("%s: no such directory; validating on %zu of %s's images instead, a "
                  "seeded share of each class (data.val_fraction %s, seed %" PRId64 ")",
                  val_dir.c_str(), val.paths.size(), cfg.train_dir.c_str(),
                  format_number(cfg.val_fraction).c_str(), ctx.seed));
  }

  FolderOptions options;
  options.image_size = cfg.image_size;
  options.resize_size = cfg.resize_size;
  options.crop_scale = cfg.crop_scale;
  options.crop_ratio = cfg.crop_ratio;
  options.hflip = cfg.hflip;
  options.max_pixels = cfg.max_image_pixels;
  options.fail_on_error = data.on_error == "fail";
  if (data.normalize) {
    options.mean = data.mean.empty() ? kImagenetMean : data.mean;
    options.std = data.mean.empty() ? kImagenetStd : data.stdev;
  }
  Splits splits;
  splits.spec.sample_shape = {3, cfg.image_size, cfg.image_size};
  splits.spec.num_classes = static_cast<int64_t>(train.classes.size());
  splits.spec.class_names = train.classes;
  FolderOptions train_options = options;
  train_options.train = true;
  splits.train = std::make_shared<ImageFolder>(std::move(train), train_options);
  splits.val = std::make_shared<ImageFolder>(std::move(val), options);
  return splits;
}

}  // namespace

void register_imagefolder(DatasetRegistry& registry) {
  registry.add("imagefolder", make_imagefolder, config::options_of<ImageFolderOptions>());
}

}  // namespace trainer::data
