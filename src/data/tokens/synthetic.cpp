// The `synthetic` dataset: one fixed random pattern per class plus gaussian noise, all derived
// from the run's seed. Small, learnable and needs no files.
// The `synthetic_tokens` dataset: windows of uniformly random token ids for language models, to
// measure speed without a corpus (there is nothing to learn in them).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <utility>

#include "data/dataset.h"
#include "util/hash.h"
#include "util/random.h"

namespace trainer::data {
namespace {

// Stream identifiers mixed into the seed.
constexpr uint64_t kPatternStream = 0x70617474ULL;  // the class patterns
constexpr uint64_t kTrainStream = 0x747261ULL;      // training samples
constexpr uint64_t kValStream = 0x76616cULL;        // validation samples

class SyntheticDataset final : public Dataset {
 public:
  // inputs: [N, ...shape] float32, targets: [N] int64.
  SyntheticDataset(torch::Tensor inputs, torch::Tensor targets)
      : inputs_(std::move(inputs)), targets_(std::move(targets)) {}

  int64_t size() const override { return inputs_.size(0); }

 protected:
  Batch fetch(const std::vector<int64_t>& indices, const Epoch& /*epoch*/) const override {
    auto idx = index_tensor(indices, size(), "synthetic");  // [B] int64
    return Batch{inputs_.index_select(0, idx), targets_.index_select(0, idx)};
  }

 private:
  torch::Tensor inputs_;   // [N, ...shape] float32
  torch::Tensor targets_;  // [N] int64
};

// Token windows: sample i of a split is seq_len + 1 ids drawn from a generator seeded by
// (seed, split, i); inputs are the first seq_len, targets the last seq_len.
class SyntheticTokens final : public Dataset {
 public:
  SyntheticTokens(int64_t count, int64_t seq_len, int64_t vocab, uint64_t seed)
      : count_(count), seq_len_(seq_len), vocab_(vocab), seed_(seed) {}

  int64_t size() const override { return count_; }

 protected:
  Batch fetch(const std::vector<int64_t>& indices, const Epoch& /*epoch*/) const override {
    check_indices(indices, size(), "synthetic_tokens");
    const auto b = static_cast<int64_t>(indices.size());
    auto windows = torch::empty({b, seq_len_ + 1}, torch::kInt64);  // [B, T + 1]
    auto* w = windows.data_ptr<int64_t>();
    for (int64_t i = 0; i < b; ++i) {
      Rng rng(mix_seed(seed_, static_cast<uint64_t>(indices[static_cast<size_t>(i)])));
      for (int64_t j = 0; j <= seq_len_; ++j) w[i * (seq_len_ + 1) + j] = rng.below(vocab_);
    }
    return Batch{windows.narrow(1, 0, seq_len_).contiguous(),   // [B, T]
                 windows.narrow(1, 1, seq_len_).contiguous()};  // [B, T]
  }

 private:
  int64_t count_, seq_len_, vocab_;
  uint64_t seed_;
};

// The `data.` keys both synthetic data sets have: their classes (or vocabulary) and lengths.
struct SyntheticSizes {
  int64_t num_classes = 10;      // classes, or the vocabulary of synthetic_tokens
  int64_t train_samples = 2048;  // training set length
  int64_t val_samples = 512;     // validation set length

  template <class V>
  void visit(V& v) {
    v("num_classes", num_classes);
    v("train_samples", train_samples);
    v("val_samples", val_samples);
  }
  void validate(config::Checks& c) const {
    c.at_least("num_classes", num_classes, 2);
    c.at_least("train_samples", train_samples, 1);
    c.at_least("val_samples", val_samples, 1);
  }
};

// The `data.` keys of synthetic_tokens.
struct SyntheticTokensOptions : SyntheticSizes {
  int64_t seq_len = 0;  // tokens per sample; 0 = the model's context length

  template <class V>
  void visit(V& v) {
    v("seq_len", seq_len);
    SyntheticSizes::visit(v);
  }
  void validate(config::Checks& c) const {
    c.at_least("seq_len", seq_len, 0);
    SyntheticSizes::validate(c);
  }
};

Splits make_synthetic_tokens(const config::DataConfig& cfg, const DataContext& ctx) {
  const auto& o = cfg.own<SyntheticTokensOptions>();
  if (o.num_classes < 2) {
    throw DataConfigError("data.num_classes", "the vocabulary size must be at least 2");
  }
  const int64_t seq_len = sequence_length(o.seq_len, ctx);
  if (o.train_samples <= 0) throw DataConfigError("data.train_samples", "must be positive");
  if (o.val_samples < 0) throw DataConfigError("data.val_samples", "must not be negative");
  const auto useed = static_cast<uint64_t>(ctx.seed);
  Splits splits;
  splits.train = std::make_shared<SyntheticTokens>(o.train_samples, seq_len, o.num_classes,
                                                   mix_seed(useed, kTrainStream));
  splits.val = std::make_shared<SyntheticTokens>(o.val_samples, seq_len, o.num_classes,
                                                 mix_seed(useed, kValStream));
  splits.spec.sample_shape = {seq_len};
  splits.spec.num_classes = o.num_classes;
  splits.spec.sequence = true;
  splits.spec.vocabulary_known = true;  // data.num_classes
  return splits;
}

// Sample i of a split: its class pattern plus noise drawn from a generator seeded by
// (seed, split, i) alone, so a sample does not depend on the split's length.
std::shared_ptr<const Dataset> make_split(const torch::Tensor& patterns, int64_t count,
                                          uint64_t seed, uint64_t stream, double noise,
                                          double scale) {
  const int64_t num_classes = patterns.size(0);
  std::vector<int64_t> shape(patterns.sizes().begin() + 1, patterns.sizes().end());
  std::vector<int64_t> full = {count};
  full.insert(full.end(), shape.begin(), shape.end());
  auto inputs = torch::empty(full, torch::kFloat32);    // [N, ...shape]
  auto targets = torch::empty({count}, torch::kInt64);  // [N]
  auto* target_ptr = targets.data_ptr<int64_t>();
  const uint64_t split_seed = mix_seed(seed, stream);
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t sample_seed = mix_seed(split_seed, static_cast<uint64_t>(i));
    const int64_t label =
        static_cast<int64_t>(splitmix64(sample_seed) % static_cast<uint64_t>(num_classes));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(sample_seed);
    auto eps = torch::randn(shape, gen, torch::kFloat32);  // [...shape]
    inputs[i].copy_((patterns[label] + noise * eps) * scale);
    target_ptr[i] = label;
  }
  return std::make_shared<SyntheticDataset>(std::move(inputs), std::move(targets));
}

// The `data.` keys of synthetic.
struct SyntheticOptions : SyntheticSizes {
  std::vector<int64_t> shape = {1, 28, 28};  // sample shape (C, H, W) or (D)
  double noise = 0.5;                        // noise added to the class patterns

  template <class V>
  void visit(V& v) {
    v("shape", shape);
    SyntheticSizes::visit(v);
    v("noise", noise);
  }
  void validate(config::Checks& c) const {
    if (shape.empty() || shape.size() > 3) {
      c.add("shape",
            "must have 1 to 3 entries (C, H, W) or (D), got " + std::to_string(shape.size()));
    } else {
      c.each_at_least("shape", shape, 1);
      // Every sample is generated into memory: at most 2^28 float32 values (1 GiB) a sample.
      constexpr int64_t kMaxElements = int64_t{1} << 28;
      int64_t elements = 1;
      bool too_large = false;
      for (int64_t d : shape) {
        if (d < 1) break;  // reported above
        too_large = too_large || elements > kMaxElements / d;
        elements = too_large ? elements : elements * d;
      }
      if (too_large) {
        c.add("shape",
              "a sample of this shape holds more than 2^28 values (1 GiB); use a "
              "smaller shape, e.g. [3, 224, 224]");
      }
    }
    SyntheticSizes::validate(c);
    c.at_least("noise", noise, 0.0);
  }
};

Splits make_synthetic(const config::DataConfig& data, const DataContext& ctx) {
  const auto& cfg = data.own<SyntheticOptions>();
  if (cfg.shape.empty() || cfg.shape.size() > 3) {
    throw DataConfigError("data.shape", "synthetic samples need 1 to 3 dimensions, got " +
                                            std::to_string(cfg.shape.size()));
  }
  for (int64_t d : cfg.shape) {
    if (d <= 0) throw DataConfigError("data.shape", "sizes must be positive");
  }
  if (cfg.num_classes < 2) throw DataConfigError("data.num_classes", "must be at least 2");
  if (cfg.train_samples <= 0) throw DataConfigError("data.train_samples", "must be positive");
  if (cfg.val_samples < 0) throw DataConfigError("data.val_samples", "must not be negative");
  if (!(cfg.noise >= 0.0)) throw DataConfigError("data.noise", "must not be negative");

  const auto useed = static_cast<uint64_t>(ctx.seed);
  std::vector<int64_t> pattern_shape = {cfg.num_classes};
  pattern_shape.insert(pattern_shape.end(), cfg.shape.begin(), cfg.shape.end());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(mix_seed(useed, kPatternStream));
  // [C, ...shape] float32, unit variance
  auto patterns = torch::randn(pattern_shape, gen, torch::kFloat32);
  // Patterns and noise are independent with mean 0, so this scale gives unit variance.
  const double scale = data.normalize ? 1.0 / std::sqrt(1.0 + cfg.noise * cfg.noise) : 1.0;

  Splits splits;
  splits.train = make_split(patterns, cfg.train_samples, useed, kTrainStream, cfg.noise, scale);
  splits.val = make_split(patterns, cfg.val_samples, useed, kValStream, cfg.noise, scale);
  splits.spec.sample_shape = cfg.shape;
  splits.spec.num_classes = cfg.num_classes;
  return splits;
}

}  // namespace

void register_synthetic(DatasetRegistry& registry) {
  registry.add("synthetic", make_synthetic, config::options_of<SyntheticOptions>());
  registry.add("synthetic_tokens", make_synthetic_tokens,
               config::options_of<SyntheticTokensOptions>());
}

}  // namespace trainer::data
