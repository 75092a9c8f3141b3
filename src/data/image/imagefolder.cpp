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
#include "data/image/image.h"
#include "data/image/image_transform.h"
#include "text/files.h"
#include "util/format.h"
#include "util/log.h"
#include "util/random.h"

namespace trainer::data {
namespace {

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

class ImageFolder final : public Dataset {
 public:
  ImageFolder(Index index, TransformOptions options, bool fail_on_error)
      : index_(std::move(index)), transform_(std::move(options)), fail_(fail_on_error) {}

  int64_t size() const override { return static_cast<int64_t>(index_.paths.size()); }

  torch::Tensor input_from_image(const std::vector<uint8_t>& bytes,
                                 const std::string& path) const override {
    return transform_.input(bytes, path);
  }
  std::string sample_name(int64_t index) const override {
    return index_.paths.at(static_cast<size_t>(index));
  }

 protected:
  Batch fetch(const std::vector<int64_t>& indices, const Epoch& epoch) const override {
    check_indices(indices, size(), "imagefolder");
    const auto load = [this](int64_t n, Rng& rng, torch::Tensor out) {
      const std::string& path = index_.paths[static_cast<size_t>(n)];
      transform_.apply(read_file(path), path, rng, std::move(out));
      return index_.labels[static_cast<size_t>(n)];
    };
    return image_batch(indices, epoch, size(), transform_, fail_, "data.on_error", load);
  }

 private:
  Index index_;
  ImageTransform transform_;
  bool fail_ = false;
};

// The `data.` keys of imagefolder.
struct ImageFolderOptions {
  std::string train_dir = "train";  // training sub-folder of data.root
  std::string val_dir = "val";      // validation sub-folder of data.root
  double val_fraction = 0.1;        // without val_dir: the seeded share of train_dir that validates
  ImageKeys image;                  // the transforms' keys (data/image/image_transform.h)

  template <class V>
  void visit(V& v) {
    image.visit(v);
    v("val_fraction", val_fraction);
    v("train_dir", train_dir);
    v("val_dir", val_dir);
  }
  void validate(config::Checks& c) const {
    image.validate(c);
    check_val_fraction(c, val_fraction);
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
  const TransformOptions train_options = transform_options(cfg.image, data, /*train=*/true);
  const TransformOptions val_options = transform_options(cfg.image, data, /*train=*/false);
  Index train = scan(train_dir, nullptr);
  Index val = split ? split_off(train, cfg.val_fraction, ctx.seed) : scan(val_dir, &train.classes);
  if (split) {
    log::warn(
        strprintf("%s: no such directory; validating on %zu of %s's images instead, a "
                  "seeded share of each class (data.val_fraction %s, seed %" PRId64 ")",
                  val_dir.c_str(), val.paths.size(), cfg.train_dir.c_str(),
                  format_number(cfg.val_fraction).c_str(), ctx.seed));
  }

  Splits splits;
  splits.spec.sample_shape = {3, cfg.image.image_size, cfg.image.image_size};
  splits.spec.num_classes = static_cast<int64_t>(train.classes.size());
  splits.spec.class_names = train.classes;
  const bool fail = data.on_error == "fail";
  splits.train = std::make_shared<ImageFolder>(std::move(train), train_options, fail);
  splits.val = std::make_shared<ImageFolder>(std::move(val), val_options, fail);
  return splits;
}

}  // namespace

void register_imagefolder(DatasetRegistry& registry) {
  registry.add("imagefolder", make_imagefolder, config::options_of<ImageFolderOptions>());
}

}  // namespace trainer::data
