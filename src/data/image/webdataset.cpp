// The `webdataset` data set: images with class labels in tar shards, as WebDataset writes them
// (timm, OpenCLIP). A sample is the consecutive members of a shard that share a key, the member
// name up to the first dot of its file name: an image (.jpg, .jpeg or .png) and a label (.cls, an
// integer .json or {"label": n}, or an integer .txt). The images get imagefolder's transforms.
//
// The shards are indexed once (headers and labels only), so any sample can be read with one open
// and one pread of its shard. Each epoch's order is the same on any number of ranks: the shards,
// in a seeded order, are dealt to data.streams streams; each stream runs through a seeded shuffle
// buffer of data.shuffle_buffer samples; the streams are interleaved one sample at a time. Rank r
// of W takes every W-th sample from r, so with W dividing data.streams it reads its own shards
// only, and a checkpoint resumes exactly at any world size with the same global batch. Loader
// workers share a rank's shards: each assembles whole batches.
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "data/image/image_transform.h"
#include "data/tokens/shards.h"
#include "text/files.h"
#include "util/format.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/random.h"

namespace trainer::data {
namespace {

// The `data.` keys of webdataset.
struct WebDatasetOptions {
  std::string shards;      // the training shards: a brace pattern, relative to data.root if set
  std::string val_shards;  // the validation shards; empty: a seeded data.val_fraction of the
                           // training samples validates
  int64_t shuffle_buffer = 1000;  // samples in each stream's shuffle buffer
  int64_t streams = 0;  // streams of shards interleaved in each epoch's order; 0 = one per shard
  int64_t classes = 0;  // labels are in [0, classes); 0 = the largest training
                        // label + 1, or the classes_file's names
  std::string classes_file;  // the class names, one a line (label 0 first); empty: classes.txt
                             // beside the training shards, where there is one
  std::string on_bad_sample = "skip";  // a sample without an image or label, with a label out of
                                       // range, an unreadable image or a truncated shard: skip
                                       // (warn, count) or fail
  double val_fraction = 0.1;           // without val_shards: the share of samples that validates
  ImageKeys image;                     // the transforms' keys (data/image/image_transform.h)

  template <class V>
  void visit(V& v) {
    image.visit(v);
    v("val_fraction", val_fraction);
    v("shards", shards);
    v("val_shards", val_shards);
    v("shuffle_buffer", shuffle_buffer);
    v("streams", streams);
    v("classes", classes);
    v("classes_file", classes_file);
    v("on_bad_sample", on_bad_sample);
  }
  void validate(config::Checks& c) const {
    image.validate(c);
    check_val_fraction(c, val_fraction);
    c.at_least("shuffle_buffer", shuffle_buffer, 1);
    c.at_least("streams", streams, 0);
    c.at_least("classes", classes, 0);
    c.one_of("on_bad_sample", on_bad_sample, {"skip", "fail"});
  }
};

// One sample: where its image is, and its label.
struct Sample {
  int32_t shard = 0;
  int64_t offset = 0, size = 0;  // the image member's bytes
  int64_t label = 0;
  std::string key;
};

// What indexing found wrong, by reason, with the first sample of each.
struct BadSamples {
  std::map<std::string, std::pair<int64_t, std::string>> by_reason;  // count, first example
  int64_t total = 0;
  bool fail = false;  // data.on_bad_sample: fail
  // A sample (or shard) at `where` that is bad for `reason`; `detail` replaces the reason in the
  // error that stops the run when `fail`.
  void add(const std::string& reason, const std::string& where, const std::string& detail = "") {
    if (fail) {
      throw DataError(where + ": " + (detail.empty() ? "a sample " + reason : detail) +
                      " (data.on_bad_sample: fail; skip skips and counts such samples)");
    }
    auto& [count, first] = by_reason[reason];
    if (count++ == 0) first = where;
    ++total;
  }
  std::string text() const {
    std::string out;
    for (const auto& [reason, entry] : by_reason) {
      out += (out.empty() ? "" : "; ") + std::to_string(entry.first) + " " + reason +
             " (first: " + entry.second + ")";
    }
    return out;
  }
};

// A member name's key and lower-case extension, as webdataset's base_plus_ext: the key is the
// name up to the first dot of its last path component. False for names without one.
bool split_name(const std::string& name, std::string& key, std::string& ext) {
  const auto slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const auto dot = name.find('.', base);
  if (dot == std::string::npos || dot == base) return false;
  key = name.substr(0, dot);
  ext = name.substr(dot + 1);
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return true;
}

// The label in a .cls, .txt or .json member's text; nullopt when it holds none.
std::optional<int64_t> parse_label(const std::string& ext, const std::vector<uint8_t>& bytes) {
  std::string text(bytes.begin(), bytes.end());
  if (ext == "json") {
    const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_number_integer()) return j.get<int64_t>();
    if (j.is_object() && j.contains("label") && j["label"].is_number_integer()) {
      return j["label"].get<int64_t>();
    }
    return std::nullopt;
  }
  const auto b = text.find_first_not_of(" \t\r\n"), e = text.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) return std::nullopt;
  text = text.substr(b, e - b + 1);
  size_t used = 0;
  try {
    const int64_t v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// The samples of one shard's listing, in archive order; problems go to `bad`.
std::vector<Sample> group_samples(const TarListing& listing, int32_t shard,
                                  const RandomAccessFile& file, BadSamples& bad) {
  std::vector<Sample> out;
  std::string cut_key, cut_ext;
  if (!listing.cut_name.empty()) split_name(listing.cut_name, cut_key, cut_ext);
  const auto& m = listing.members;
  for (size_t i = 0; i < m.size();) {
    std::string key, ext;
    if (!split_name(m[i].name, key, ext) || m[i].name.rfind("__", 0) == 0) {
      ++i;
      continue;
    }
    const TarMember* image = nullptr;
    std::optional<int64_t> label;
    bool labelled = false;
    std::set<std::string> exts;
    std::string twice;  // an extension of two members: which one is meant is unknown
    for (std::string k = key; i < m.size() && split_name(m[i].name, k, ext) && k == key; ++i) {
      if (!exts.insert(ext).second && twice.empty()) twice = ext;
      if (!image && (ext == "jpg" || ext == "jpeg" || ext == "png")) image = &m[i];
      if (!labelled && (ext == "cls" || ext == "json" || ext == "txt")) {
        label = parse_label(ext, file.read(m[i].offset, m[i].size));
        labelled = label.has_value();
      }
    }
    const std::string where = file.path() + ": '" + key + "'";
    if (key == cut_key) continue;  // the shard was cut inside this sample: counted as truncated
    if (!twice.empty()) {
      bad.add("with two members of one name", where,
              "two members '" + key + "." + twice +
                  "' in one sample (webdataset: duplicate file name); which one is meant is "
                  "unknown");
    } else if (!image) {
      bad.add("without an image (.jpg, .jpeg or .png)", where);
    } else if (!label) {
      bad.add("without a label (an integer in .cls, .json or .txt)", where);
    } else {
      out.push_back({shard, image->offset, image->size, *label, key});
    }
  }
  return out;
}

// The shard files' paths, shared by the splits that read them. A sample's read opens its shard
// (one open and one pread): any number of shards, and no descriptor held between reads.
using Files = std::vector<std::string>;

// Stream identifiers of the per-epoch draws.
constexpr uint64_t kShardOrder = 0x7764732d6f726472ULL;
constexpr uint64_t kBuffer = 0x7764732d62756672ULL;
constexpr uint64_t kHoldOut = 0x7764732d76616c5fULL;

// `stream` through a shuffle buffer of `size` samples, as webdataset's shuffle(): the first
// `size` fill it, then each next one takes the place of a random one, which goes out; at the end
// the buffer goes out in random order.
std::vector<int64_t> buffer_shuffle(const std::vector<int64_t>& stream, int64_t size, Rng& rng) {
  std::vector<int64_t> out, buffer;
  out.reserve(stream.size());
  for (int64_t s : stream) {
    if (static_cast<int64_t>(buffer.size()) < size) {
      buffer.push_back(s);
      continue;
    }
    const auto k = static_cast<size_t>(rng.below(size));
    out.push_back(buffer[k]);
    buffer[k] = s;
  }
  for (auto i = static_cast<int64_t>(buffer.size()) - 1; i > 0; --i) {
    std::swap(buffer[static_cast<size_t>(i)], buffer[static_cast<size_t>(rng.below(i + 1))]);
  }
  out.insert(out.end(), buffer.begin(), buffer.end());
  return out;
}

class WebDataset final : public Dataset {
 public:
  // `streams` 0: one per shard of `files`.
  WebDataset(std::shared_ptr<const Files> files, std::vector<Sample> samples, int64_t streams,
             int64_t buffer, TransformOptions transform, bool fail)
      : files_(std::move(files)),
        samples_(std::move(samples)),
        by_shard_(files_->size()),
        streams_(streams > 0 ? streams : static_cast<int64_t>(files_->size())),
        buffer_(buffer),
        transform_(std::move(transform)),
        fail_(fail) {
    for (size_t i = 0; i < samples_.size(); ++i) {
      by_shard_[static_cast<size_t>(samples_[i].shard)].push_back(static_cast<int64_t>(i));
    }
  }

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }

  torch::Tensor input_from_image(const std::vector<uint8_t>& bytes,
                                 const std::string& path) const override {
    return transform_.input(bytes, path);
  }

  std::string sample_name(int64_t index) const override {
    const Sample& s = samples_.at(static_cast<size_t>(index));
    return (*files_)[static_cast<size_t>(s.shard)] + ":" + s.key;
  }

  std::vector<int64_t> order(bool shuffle, uint64_t seed, int64_t epoch) const override {
    const size_t shards = by_shard_.size();
    std::vector<size_t> deal(shards);
    for (size_t i = 0; i < shards; ++i) deal[i] = i;
    Rng rng(mix_seed(mix_seed(seed, kShardOrder), static_cast<uint64_t>(epoch)));
    for (auto i = static_cast<int64_t>(shards) - 1; shuffle && i > 0; --i) {
      std::swap(deal[static_cast<size_t>(i)], deal[static_cast<size_t>(rng.below(i + 1))]);
    }
    std::vector<std::vector<int64_t>> streams(static_cast<size_t>(streams_));
    for (size_t i = 0; i < shards; ++i) {
      const auto& mine = by_shard_[deal[i]];
      auto& to = streams[i % streams.size()];
      to.insert(to.end(), mine.begin(), mine.end());
    }
    for (size_t v = 0; shuffle && v < streams.size(); ++v) {
      Rng buffer_rng(mix_seed(mix_seed(seed, kBuffer + v), static_cast<uint64_t>(epoch)));
      streams[v] = buffer_shuffle(streams[v], buffer_, buffer_rng);
    }
    std::vector<int64_t> out;
    out.reserve(samples_.size());
    for (size_t k = 0; out.size() < samples_.size(); ++k) {  // one sample of each stream a round
      for (const auto& stream : streams) {
        if (k < stream.size()) out.push_back(stream[k]);
      }
    }
    return out;
  }

 protected:
  Batch fetch(const std::vector<int64_t>& indices, const Epoch& epoch) const override {
    check_indices(indices, size(), "webdataset");
    const auto load = [this](int64_t n, Rng& rng, torch::Tensor out) {
      const Sample& s = samples_[static_cast<size_t>(n)];
      const std::string& path = (*files_)[static_cast<size_t>(s.shard)];
      transform_.apply(RandomAccessFile(path).read(s.offset, s.size), path + ": '" + s.key + "'",
                       rng, std::move(out));
      return s.label;
    };
    return image_batch(indices, epoch, size(), transform_, fail_, "data.on_bad_sample", load);
  }

 private:
  std::shared_ptr<const Files> files_;
  std::vector<Sample> samples_;
  std::vector<std::vector<int64_t>> by_shard_;  // each shard's samples, in archive order
  int64_t streams_;
  int64_t buffer_;
  ImageTransform transform_;
  bool fail_;
};

// One split's shards: the files of a pattern, and their samples.
struct ShardSet {
  std::shared_ptr<Files> files = std::make_shared<Files>();
  std::vector<Sample> samples;
};

// Indexes the shards of `pattern` (the value of data.`key`). Problems go to `bad`, or throw when
// `fail`.
ShardSet index_shards(const std::string& pattern, const std::string& root, const std::string& key,
                      BadSamples& bad) {
  std::vector<std::string> paths;
  try {
    paths = expand_braces(pattern);
  } catch (const std::invalid_argument& e) {
    throw DataConfigError("data." + key, e.what());
  }
  ShardSet set;
  for (auto& path : paths) {
    if (path.empty()) {
      throw DataConfigError("data." + key, "'" + pattern + "' names an empty file name");
    }
    if (!root.empty() && path.front() != '/') path = root + "/" + path;
    if (file_size(path) < 0) {
      throw DataConfigError("data." + key, path + ": no such file (one of the " +
                                               std::to_string(paths.size()) + " shards of '" +
                                               pattern + "')");
    }
    set.files->push_back(path);
    const RandomAccessFile file(path);
    const TarListing listing = list_tar(file);
    if (!listing.problem.empty()) {
      bad.add("truncated or corrupt shards", path, listing.problem);
    }
    auto samples = group_samples(listing, static_cast<int32_t>(set.files->size() - 1), file, bad);
    set.samples.insert(set.samples.end(), samples.begin(), samples.end());
  }
  return set;
}

// Removes the samples whose label is outside [0, classes), as bad ones.
void check_labels(std::vector<Sample>& samples, int64_t classes, const Files& files,
                  BadSamples& bad) {
  std::vector<Sample> kept;
  kept.reserve(samples.size());
  const std::string range = "[0, " + std::to_string(classes) + ")";
  for (auto& s : samples) {
    if (s.label >= 0 && s.label < classes) {
      kept.push_back(std::move(s));
      continue;
    }
    const std::string where = files[static_cast<size_t>(s.shard)] + ": '" + s.key + "'";
    bad.add("with a label outside " + range, where,
            "label " + std::to_string(s.label) + " is outside " + range +
                " (set data.classes to the number of classes)");
  }
  samples = std::move(kept);
}

// The samples of `train` that validate instead (data.val_fraction, seeded by each sample's key).
std::vector<Sample> hold_out(std::vector<Sample>& train, double fraction, int64_t seed) {
  std::vector<Sample> kept, val;
  for (auto& s : train) {
    uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a of the key
    for (unsigned char c : s.key) h = (h ^ c) * 0x100000001b3ULL;
    Rng rng(mix_seed(mix_seed(static_cast<uint64_t>(seed), kHoldOut), h));
    (rng.uniform() < fraction ? val : kept).push_back(std::move(s));
  }
  train = std::move(kept);
  return val;
}

// The class names in `path`, one a line (label 0 first), stripped of surrounding blanks as
// timm's --class-map reads them. Throws DataConfigError(data.classes_file) for a file without
// names, an empty line among them, or a name given twice.
std::vector<std::string> read_class_names(const std::string& path) {
  const auto bytes = read_file(path);
  std::string text(bytes.begin(), bytes.end());
  text.erase(text.find_last_not_of(" \t\r\n") + 1);  // blank lines at the end
  std::vector<std::string> names;
  std::map<std::string, size_t> line_of;
  const std::string hint = "; one class name a line, label 0's first (make_shards.py writes them)";
  for (size_t at = 0; !text.empty() && at <= text.size();) {
    auto end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string name = text.substr(at, end - at);
    const auto b = name.find_first_not_of(" \t\r"), e = name.find_last_not_of(" \t\r");
    name = b == std::string::npos ? "" : name.substr(b, e - b + 1);
    const std::string where = path + ":" + std::to_string(names.size() + 1) + ": ";
    if (name.empty()) throw DataConfigError("data.classes_file", where + "an empty line" + hint);
    if (line_of.count(name)) {
      throw DataConfigError("data.classes_file", where + "'" + name + "' again (line " +
                                                     std::to_string(line_of[name]) + ")" + hint);
    }
    line_of[name] = names.size() + 1;
    names.push_back(name);
    at = end + 1;
  }
  if (names.empty()) throw DataConfigError("data.classes_file", path + ": no class names" + hint);
  return names;
}

// The class names of data.classes_file (relative to data.root), else of classes.txt beside the
// first training shard where there is one; empty without either. Their number must be
// data.classes where that is set.
std::vector<std::string> class_names(const WebDatasetOptions& cfg, const std::string& root,
                                     const std::string& first_shard) {
  std::string path = cfg.classes_file;
  if (path.empty()) {
    const auto slash = first_shard.rfind('/');
    path = (slash == std::string::npos ? "" : first_shard.substr(0, slash + 1)) + "classes.txt";
    if (!is_file(path)) return {};
  } else {
    if (!root.empty() && path.front() != '/') path = root + "/" + path;
    if (!is_file(path)) throw DataConfigError("data.classes_file", path + ": no such file");
  }
  auto names = read_class_names(path);
  if (cfg.classes != 0 && cfg.classes != static_cast<int64_t>(names.size())) {
    throw DataConfigError(
        "data.classes",
        std::to_string(cfg.classes) + " classes, but " + path + " names " +
            std::to_string(names.size()) +
            (cfg.classes_file.empty() ? " (read as it lies beside the shards)" : "") +
            "; make them agree, or set data.classes_file to the file of the "
            "shards' class names");
  }
  log::info("webdataset: " + std::to_string(names.size()) + " class names from " + path);
  return names;
}

Splits make_webdataset(const config::DataConfig& data, const DataContext& ctx) {
  const auto& cfg = data.own<WebDatasetOptions>();
  if (cfg.shards.empty()) {
    throw DataConfigError("data.shards",
                          "set it to the training shards, e.g. \"train-{000000..000146}.tar\" "
                          "(scripts/make_shards.py writes them from an image folder)");
  }
  const std::string root = data.root.empty() ? "" : strip_slashes(data.root);
  BadSamples bad;
  bad.fail = cfg.on_bad_sample == "fail";
  ShardSet train = index_shards(cfg.shards, root, "shards", bad);
  if (cfg.streams > static_cast<int64_t>(train.files->size())) {
    throw DataConfigError("data.streams", "must be at most the number of training shards (" +
                                              std::to_string(train.files->size()) + "), got " +
                                              std::to_string(cfg.streams));
  }
  const auto names = class_names(cfg, root, train.files->front());
  int64_t classes = names.empty() ? cfg.classes : static_cast<int64_t>(names.size());
  if (classes == 0) {  // neither data.classes nor names: the largest training label + 1
    for (const auto& s : train.samples) classes = std::max(classes, s.label + 1);
  }
  check_labels(train.samples, classes, *train.files, bad);
  ShardSet val;
  if (cfg.val_shards.empty()) {
    val.files = train.files;
    val.samples = hold_out(train.samples, cfg.val_fraction, ctx.seed);
  } else {
    val = index_shards(cfg.val_shards, root, "val_shards", bad);
    check_labels(val.samples, classes, *val.files, bad);
  }
  if (train.samples.empty()) {
    throw DataError(cfg.shards + ": no training samples in " + std::to_string(train.files->size()) +
                    " shards" + (bad.total ? " (" + bad.text() + ")" : ""));
  }
  if (bad.total > 0) log::warn("webdataset: skipped " + bad.text() + " (data.on_bad_sample: skip)");
  log::info(strprintf(
      "webdataset: %zu training shards, %zu training and %zu validation samples "
      "(%s), %" PRId64 " classes",
      train.files->size(), train.samples.size(), val.samples.size(),
      cfg.val_shards.empty() ? "a seeded data.val_fraction of the shards'" : "data.val_shards",
      classes));
  Splits splits;
  splits.spec.sample_shape = {3, cfg.image.image_size, cfg.image.image_size};
  splits.spec.num_classes = classes;
  splits.spec.class_names = names;
  splits.train = std::make_shared<WebDataset>(
      train.files, std::move(train.samples), cfg.streams, cfg.shuffle_buffer,
      transform_options(cfg.image, data, /*train=*/true), bad.fail);
  splits.val = std::make_shared<WebDataset>(
      val.files, std::move(val.samples), /*streams=*/1, cfg.shuffle_buffer,
      transform_options(cfg.image, data, /*train=*/false), bad.fail);
  return splits;
}

}  // namespace

void register_webdataset(DatasetRegistry& registry) {
  registry.add("webdataset", make_webdataset, config::options_of<WebDatasetOptions>());
}

}  // namespace trainer::data
