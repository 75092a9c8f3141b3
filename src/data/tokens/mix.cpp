// The `mix` data set: samples drawn from several data sets (data.mix) in proportion to their
// weights, as Megatron-LM's blended data sets draw them. Position i of an epoch goes to the part
// furthest below its share (weight * (i + 1) - drawn so far, the largest; ties to the first), so
// every prefix of an epoch holds each part within one sample of its share. A part's draws walk
// its own order (drawn from (seed, part, pass) when shuffling) across epochs: a part drawn less
// than its size in an epoch goes on where it stopped in the next; one drawn more starts a new
// pass. An epoch is as long as the parts together. The order does not depend on the number of
// ranks, so a checkpoint resumes exactly. Evaluation reads the parts' validation splits one after
// another.
#include <torch/torch.h>

#include <algorithm>
#include <cinttypes>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "util/format.h"
#include "util/hash.h"
#include "util/log.h"

namespace trainer::data {
namespace {

// The parts' samples one after another: index offset[j] + s is sample s of part j.
class Mixed final : public Dataset {
 public:
  // `weights` empty: the concatenation, in order (evaluation); else drawn by weight.
  Mixed(std::vector<std::shared_ptr<const Dataset>> parts, std::vector<std::string> names,
        std::vector<double> weights)
      : parts_(std::move(parts)), names_(std::move(names)), weights_(std::move(weights)) {
    for (const auto& p : parts_) offsets_.push_back(size_ += p->size());
    offsets_.insert(offsets_.begin(), 0);
    offsets_.pop_back();
    if (!weights_.empty()) draws_ = blend();
  }

  int64_t size() const override { return size_; }

  torch::Tensor input_from_image(const std::vector<uint8_t>& bytes,
                                 const std::string& path) const override {
    return parts_.front()->input_from_image(bytes, path);
  }

  std::string sample_name(int64_t index) const override {
    const size_t j = part_of(index);
    return names_[j] + ":" + parts_[j]->sample_name(index - offsets_[j]);
  }

  std::vector<int64_t> order(bool shuffle, uint64_t seed, int64_t epoch) const override {
    if (weights_.empty()) return Dataset::order(shuffle, seed, epoch);
    const size_t k = parts_.size();
    std::vector<int64_t> per_epoch(k, 0), drawn(k, 0), pass(k, -1);
    for (size_t j : draws_) ++per_epoch[j];
    std::vector<std::vector<int64_t>> orders(k);
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(size_));
    for (size_t j : draws_) {
      const int64_t n = parts_[j]->size();
      const int64_t d = epoch * per_epoch[j] + drawn[j]++;  // the part's d-th draw of the run
      if (d / n != pass[j]) {
        pass[j] = d / n;
        orders[j] = parts_[j]->order(shuffle, mix_seed(seed, j), pass[j]);
      }
      out.push_back(offsets_[j] + orders[j][static_cast<size_t>(d % n)]);
    }
    return out;
  }

  // Each part's share of an epoch, for the log.
  std::string proportions() const {
    std::vector<int64_t> count(parts_.size(), 0);
    for (size_t j : draws_) ++count[j];
    std::string out;
    for (size_t j = 0; j < parts_.size(); ++j) {
      const auto n = static_cast<double>(parts_[j]->size());
      out +=
          strprintf("%s%s %.1f%% (%" PRId64 " samples an epoch, %.2f passes over its %" PRId64 ")",
                    j ? "; " : "", names_[j].c_str(),
                    100.0 * static_cast<double>(count[j]) / static_cast<double>(size_), count[j],
                    static_cast<double>(count[j]) / n, parts_[j]->size());
    }
    return out;
  }

 protected:
  Batch fetch(const std::vector<int64_t>& indices, const Epoch& epoch) const override {
    check_indices(indices, size_, "mix");
    std::vector<std::vector<int64_t>> at(parts_.size()), local(parts_.size());
    for (size_t i = 0; i < indices.size(); ++i) {
      const size_t j = part_of(indices[i]);
      at[j].push_back(static_cast<int64_t>(i));
      local[j].push_back(indices[i] - offsets_[j]);
    }
    Batch out;
    for (size_t j = 0; j < parts_.size(); ++j) {
      if (at[j].empty()) continue;
      const Batch b = parts_[j]->get(local[j], epoch);
      if (!out.inputs.defined()) {
        const auto b_size = static_cast<int64_t>(indices.size());
        out.inputs = torch::empty(with_batch(b.inputs, b_size), b.inputs.options());
        out.targets = torch::empty(with_batch(b.targets, b_size), b.targets.options());
      }
      const auto where = torch::tensor(at[j], torch::kInt64);
      out.inputs.index_copy_(/*dim=*/0, where, b.inputs);
      out.targets.index_copy_(/*dim=*/0, where, b.targets);
      if (b.positions.defined()) {  // a packed part's: the other parts' rows one document each
        if (!out.positions.defined()) {
          const int64_t t = b.positions.size(1);
          out.positions = torch::arange(t, torch::kInt64).repeat({out.inputs.size(0), 1});
        }
        out.positions.index_copy_(/*dim=*/0, where, b.positions);  // [B, T]
      }
      out.bad_samples += b.bad_samples;
    }
    return out;
  }

 private:
  static std::vector<int64_t> with_batch(const torch::Tensor& t, int64_t b) {
    auto shape = t.sizes().vec();
    shape[0] = b;
    return shape;
  }

  size_t part_of(int64_t index) const {
    return static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), index) -
                               offsets_.begin() - 1);
  }

  // The part of each position of an epoch: the one furthest below its share.
  std::vector<size_t> blend() const {
    double total = 0.0;
    for (double w : weights_) total += w;
    std::vector<int64_t> count(parts_.size(), 0);
    std::vector<size_t> out(static_cast<size_t>(size_));
    for (int64_t i = 0; i < size_; ++i) {
      size_t best = 0;
      double most = -1e300;
      for (size_t j = 0; j < parts_.size(); ++j) {
        const double behind =
            weights_[j] / total * static_cast<double>(i + 1) - static_cast<double>(count[j]);
        if (behind > most) most = behind, best = j;
      }
      ++count[best];
      out[static_cast<size_t>(i)] = best;
    }
    return out;
  }

  std::vector<std::shared_ptr<const Dataset>> parts_;
  std::vector<std::string> names_;  // "data.mix[j] (name)"
  std::vector<double> weights_;
  std::vector<int64_t> offsets_;
  int64_t size_ = 0;
  std::vector<size_t> draws_;  // the part of each position of an epoch
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out;
  for (int64_t d : shape) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return "[" + out + "]";
}

// The part's DataConfigError, its key moved under the part ("data.root" -> "data.mix[1].root").
DataConfigError in_part(const DataConfigError& e, const std::string& prefix) {
  const std::string key = e.key().rfind("data.", 0) == 0 ? prefix + e.key().substr(5) : e.key();
  return DataConfigError(key, e.message());
}

// A part's label space for messages: "2 classes (a, b)" or "4 classes, unnamed (labels 0..3)".
std::string classes_text(const DataSpec& spec) {
  std::string out = std::to_string(spec.num_classes) + " classes";
  if (spec.class_names.empty()) {
    return out + ", unnamed (labels 0.." + std::to_string(spec.num_classes - 1) + ")";
  }
  std::string names;
  for (size_t i = 0; i < spec.class_names.size() && i < 6; ++i) {
    names += (i ? ", " : "") + spec.class_names[i];
  }
  return out + " (" + names + (spec.class_names.size() > 6 ? ", ..." : "") + ")";
}

// Class labels mean the same in `part` as in `named` (the first part that names its classes, or
// the first part): the same number of classes, and the same names in the same order where both
// name them. A part without names takes the other's, and a warning says so.
void check_label_space(const DataSpec& named, const DataSpec& part, const std::string& named_name,
                       const std::string& part_name) {
  if (named.num_classes != part.num_classes ||
      (!part.class_names.empty() && part.class_names != named.class_names)) {
    throw DataConfigError(
        "data.mix", named_name + " has " + classes_text(named) + ", " + part_name + " " +
                        classes_text(part) +
                        ": a label would mean another class in each; mix data sets with the same "
                        "classes in the same order (webdataset: data.classes_file names them, "
                        "data.classes sets their number)");
  }
  if (part.class_names.empty() && !named.class_names.empty()) {
    log::warn("data.mix: " + part_name +
              " does not name its classes; its labels are taken to mean " + named_name + "'s " +
              classes_text(named));
  }
}

// A token part's vocabulary for messages: "a vocabulary of 256 tokens" where the part knows it
// (bytes, a tokenizer's, a token file's description), else "token ids up to 999" (a token file's
// largest).
std::string vocabulary_text(const DataSpec& spec) {
  if (spec.vocabulary_known)
    return "a vocabulary of " + std::to_string(spec.num_classes) + " tokens";
  return "token ids up to " + std::to_string(spec.num_classes - 1);
}

// Token ids mean the same in every part: the parts that know their vocabulary (bytes, a
// tokenizer's) have one size, and no part's ids reach past it. Token files that only show their
// largest id may differ in it.
void check_vocabularies(const std::vector<Splits>& parts, const std::vector<std::string>& names) {
  size_t known = 0;
  while (known < parts.size() && !parts[known].spec.vocabulary_known) ++known;
  if (known == parts.size()) return;
  const DataSpec& k = parts[known].spec;
  for (size_t j = 0; j < parts.size(); ++j) {
    const DataSpec& s = parts[j].spec;
    if (s.vocabulary_known ? s.num_classes == k.num_classes : s.num_classes <= k.num_classes) {
      continue;
    }
    throw DataConfigError(
        "data.mix", names[known] + " has " + vocabulary_text(k) + ", " + names[j] + " " +
                        vocabulary_text(s) +
                        ": a token id would mean another token in each; mix token sets made "
                        "with one tokenizer (trainer tokenize --tokenizer; text read as bytes "
                        "only with other text read as bytes, data.token_format)");
  }
}

// The spec of the mix: the parts' samples must have one shape and kind; class labels one meaning
// (check_label_space); token ids one meaning (check_vocabularies), the largest vocabulary.
DataSpec combined_spec(const std::vector<Splits>& parts, const std::vector<std::string>& names) {
  size_t named = 0;  // the first part that names its classes, else the first
  while (named + 1 < parts.size() && parts[named].spec.class_names.empty()) ++named;
  if (parts[named].spec.class_names.empty()) named = 0;
  DataSpec spec = parts[named].spec;
  for (size_t j = 0; j < parts.size(); ++j) {
    const DataSpec& s = parts[j].spec;
    if (s.sample_shape != spec.sample_shape || s.sequence != spec.sequence) {
      throw DataConfigError("data.mix",
                            names[j] + "'s samples are " + shape_text(s.sample_shape) + ", " +
                                names[named] + "'s " + shape_text(spec.sample_shape) +
                                "; mix data sets whose samples have one shape (e.g. one "
                                "data.image_size, one data.seq_len)");
    }
    if (j == named) continue;
    if (!s.sequence) check_label_space(spec, s, names[named], names[j]);
    spec.num_classes = std::max(spec.num_classes, s.num_classes);
    spec.packed = spec.packed || s.packed;
    spec.vocabulary_known = spec.vocabulary_known || s.vocabulary_known;
  }
  if (spec.sequence) check_vocabularies(parts, names);
  return spec;
}

Splits make_mix(const config::DataConfig& data, const DataContext& ctx) {
  const auto& items = data.mix.items;
  if (items.empty()) {
    throw DataConfigError("data.mix",
                          "list the data sets to draw from, each with its keys and a weight, "
                          "e.g. mix: [{name: fashion_mnist, weight: 0.7}, {name: imagefolder, "
                          "root: photos, weight: 0.3}]");
  }
  std::vector<Splits> parts;
  std::vector<std::string> names;
  std::vector<double> weights;
  for (size_t j = 0; j < items.size(); ++j) {
    const std::string prefix = "data.mix[" + std::to_string(j) + "].";
    const auto& part = items[j];
    if (part.name == "mix" || !dataset_registry().contains(part.name)) {
      std::string known;
      for (const auto& n : dataset_registry().names()) {
        if (n != "mix") known += (known.empty() ? "" : ", ") + n;
      }
      throw DataConfigError(
          prefix + "name", "unknown data set '" + part.name + "' for a part; registered: " + known);
    }
    config::DataConfig own = data;
    static_cast<config::DataSetKeys&>(own) = part;
    own.mix.items.clear();
    try {
      parts.push_back(dataset_registry().get(part.name)(own, ctx));
    } catch (const DataConfigError& e) {
      throw in_part(e, prefix);
    }
    names.push_back("data.mix[" + std::to_string(j) + "] (" + part.name + ")");
    if (parts.back().train->size() == 0) {
      throw DataConfigError(prefix + "name", names.back() + " has no training samples");
    }
    weights.push_back(part.weight);
  }
  Splits out;
  out.spec = combined_spec(parts, names);
  std::vector<std::shared_ptr<const Dataset>> train, val;
  for (const auto& p : parts) {
    train.push_back(p.train);
    val.push_back(p.val);
  }
  auto mixed = std::make_shared<Mixed>(std::move(train), names, std::move(weights));
  log::info("data.mix: " + mixed->proportions());
  out.train = std::move(mixed);
  out.val = std::make_shared<Mixed>(std::move(val), names, std::vector<double>{});
  return out;
}

}  // namespace

void register_mix(DatasetRegistry& registry) {
  registry.add("mix", make_mix);
}

}  // namespace trainer::data
