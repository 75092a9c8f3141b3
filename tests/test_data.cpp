// Datasets (synthetic, fashion_mnist, cifar10), in-memory image augmentation, the batch loader
// and its sharding.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "data/dataset.h"
#include "data/image/memory_images.h"
#include "data/tokens/shards.h"
#include "idx_files.h"
#include "image_files.h"
#include "temp_dir.h"

namespace trainer::data {
namespace {

namespace fs = std::filesystem;

config::DataConfig synthetic_config() {
  config::DataConfig cfg = default_data_config();
  cfg.name = "synthetic";
  cfg.options.set("shape", std::vector<int64_t>{1, 6, 5});
  cfg.options.set("num_classes", int64_t{4});
  cfg.options.set("train_samples", int64_t{50});
  cfg.options.set("val_samples", int64_t{20});
  cfg.options.set("noise", 0.5);
  return cfg;
}

Splits make(const config::DataConfig& cfg, int64_t seed) {
  return dataset_registry().get(cfg.name)(cfg, DataContext{seed});
}

std::vector<int64_t> all_indices(const Dataset& d) {
  std::vector<int64_t> v(static_cast<size_t>(d.size()));
  for (int64_t i = 0; i < d.size(); ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

TEST(SyntheticTest, Registered) {
  EXPECT_TRUE(dataset_registry().contains("synthetic"));
  EXPECT_TRUE(dataset_registry().contains("fashion_mnist"));
}

TEST(SyntheticTest, SizesShapesAndClasses) {
  const Splits s = make(synthetic_config(), /*seed=*/1);
  EXPECT_EQ(s.train->size(), 50);
  EXPECT_EQ(s.val->size(), 20);
  EXPECT_EQ(s.spec.sample_shape, (std::vector<int64_t>{1, 6, 5}));
  EXPECT_EQ(s.spec.num_classes, 4);
  const Batch b = s.train->get({0, 3, 7});
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{3, 1, 6, 5}));
  EXPECT_EQ(b.inputs.dtype(), torch::kFloat32);
  EXPECT_EQ(b.targets.sizes(), (std::vector<int64_t>{3}));
  EXPECT_EQ(b.targets.dtype(), torch::kInt64);
  const Batch all = s.train->get(all_indices(*s.train));
  EXPECT_GE(all.targets.min().item<int64_t>(), 0);
  EXPECT_LT(all.targets.max().item<int64_t>(), 4);
  EXPECT_GT(std::get<0>(torch::_unique(all.targets)).numel(), 1);
}

TEST(SyntheticTest, OneDimensionalShape) {
  auto cfg = synthetic_config();
  cfg.options.set("shape", std::vector<int64_t>{16});
  const Splits s = make(cfg, /*seed=*/1);
  EXPECT_EQ(s.train->get({1, 2}).inputs.sizes(), (std::vector<int64_t>{2, 16}));
}

TEST(SyntheticTest, RejectsBadShape) {
  auto cfg = synthetic_config();
  cfg.options.set("shape", std::vector<int64_t>{});
  EXPECT_THROW(make(cfg, /*seed=*/1), std::invalid_argument);
  cfg.options.set("shape", std::vector<int64_t>{1, 2, 3, 4});
  EXPECT_THROW(make(cfg, /*seed=*/1), std::invalid_argument);
}

TEST(SyntheticTest, TokenWindowsAreShiftedSequencesOfTheVocabulary) {
  config::DataConfig cfg = default_data_config();
  cfg.name = "synthetic_tokens";
  cfg.options.set("num_classes", int64_t{37});  // the vocabulary
  cfg.options.set("seq_len", int64_t{12});
  cfg.options.set("train_samples", int64_t{20});
  cfg.options.set("val_samples", int64_t{4});
  const Splits s = make(cfg, /*seed=*/2);
  EXPECT_TRUE(s.spec.sequence);
  EXPECT_EQ(s.spec.num_classes, 37);
  EXPECT_EQ(s.spec.sample_shape, (std::vector<int64_t>{12}));
  EXPECT_EQ(s.train->size(), 20);
  EXPECT_EQ(s.val->size(), 4);
  const Batch b = s.train->get(all_indices(*s.train));  // inputs, targets: [20, 12]
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{20, 12}));
  EXPECT_EQ(b.inputs.dtype(), torch::kInt64);
  EXPECT_TRUE(torch::equal(b.inputs.narrow(1, 1, 11), b.targets.narrow(1, 0, 11)));
  EXPECT_GE(b.inputs.min().item<int64_t>(), 0);
  EXPECT_LT(b.targets.max().item<int64_t>(), 37);
  EXPECT_GT(std::get<0>(torch::_unique(b.inputs)).numel(), 30);  // the whole vocabulary in use
  // A pure function of (seed, split, index).
  EXPECT_TRUE(torch::equal(s.train->get({7}).inputs[0], b.inputs[7]));
  EXPECT_TRUE(torch::equal(make(cfg, /*seed=*/2).train->get({3}).inputs, s.train->get({3}).inputs));
  EXPECT_FALSE(
      torch::equal(make(cfg, /*seed=*/3).train->get({3}).inputs, s.train->get({3}).inputs));
  EXPECT_FALSE(torch::equal(s.val->get({3}).inputs, s.train->get({3}).inputs));
  cfg.options.set("num_classes", int64_t{1});
  EXPECT_THROW(make(cfg, /*seed=*/1), std::invalid_argument);
}

TEST(SyntheticTest, DeterministicFromSeed) {
  const auto cfg = synthetic_config();
  const Splits a = make(cfg, /*seed=*/7);
  const Splits b = make(cfg, /*seed=*/7);
  const Splits c = make(cfg, /*seed=*/8);
  const Batch ba = a.train->get(all_indices(*a.train));
  const Batch bb = b.train->get(all_indices(*b.train));
  const Batch bc = c.train->get(all_indices(*c.train));
  EXPECT_TRUE(torch::equal(ba.inputs, bb.inputs));
  EXPECT_TRUE(torch::equal(ba.targets, bb.targets));
  EXPECT_FALSE(torch::equal(ba.inputs, bc.inputs));
  // The global torch generator plays no part.
  torch::manual_seed(123);
  const Splits d = make(cfg, /*seed=*/7);
  EXPECT_TRUE(torch::equal(ba.inputs, d.train->get(all_indices(*d.train)).inputs));
}

TEST(SyntheticTest, GetIsAPureFunctionOfTheIndex) {
  const Splits s = make(synthetic_config(), /*seed=*/3);
  const Batch one = s.train->get({5});
  const Batch many = s.train->get({2, 5, 9});
  EXPECT_TRUE(torch::equal(one.inputs[0], many.inputs[1]));
  EXPECT_EQ(one.targets[0].item<int64_t>(), many.targets[1].item<int64_t>());
}

TEST(SyntheticTest, TrainAndValDiffer) {
  const Splits s = make(synthetic_config(), /*seed=*/3);
  std::vector<int64_t> first(20);
  for (int64_t i = 0; i < 20; ++i) first[static_cast<size_t>(i)] = i;
  EXPECT_FALSE(torch::equal(s.train->get(first).inputs, s.val->get(first).inputs));
}

TEST(SyntheticTest, Learnable) {
  // Nearest class mean on the training set classifies the validation set well.
  auto cfg = synthetic_config();
  cfg.options.set("train_samples", int64_t{400});
  cfg.options.set("val_samples", int64_t{100});
  const Splits s = make(cfg, /*seed=*/5);
  const Batch train = s.train->get(all_indices(*s.train));
  const Batch val = s.val->get(all_indices(*s.val));
  auto x = train.inputs.flatten(1);  // [N, D]
  std::vector<torch::Tensor> means;
  for (int64_t c = 0; c < cfg.options.value<int64_t>("num_classes"); ++c)
    means.push_back(x.index({train.targets == c}).mean(0));
  auto centers = torch::stack(means);                        // [C, D]
  auto dist = torch::cdist(val.inputs.flatten(1), centers);  // [M, C]
  const double acc = (dist.argmin(1) == val.targets).to(torch::kFloat64).mean().item<double>();
  EXPECT_GT(acc, 0.9);
}

// --- fashion_mnist ---------------------------------------------------------------------------

using test_support::idx_bytes;
using test_support::write_bytes;

class FashionMnistTest : public ::testing::Test {
 protected:
  // A split of `n` 28x28 images (pixel values from the index) with labels i % 10; the train
  // split gzip-compressed, t10k raw.
  void write_split(const std::string& prefix, uint32_t n, uint32_t num_labels) {
    std::vector<uint8_t> pixels(n * 28 * 28);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i * 13) % 256);
    std::vector<uint8_t> labels(num_labels);
    for (uint32_t i = 0; i < num_labels; ++i) labels[i] = static_cast<uint8_t>(i % 10);
    const bool gzip = prefix == "train";
    const std::string ext = gzip ? ".gz" : "";
    write_bytes(dir_ / (prefix + "-images-idx3-ubyte" + ext), idx_bytes(0x08, {n, 28, 28}, pixels),
                gzip);
    write_bytes(dir_ / (prefix + "-labels-idx1-ubyte" + ext), idx_bytes(0x08, {num_labels}, labels),
                gzip);
  }

  config::DataConfig config(bool normalize) const {
    config::DataConfig cfg = default_data_config();
    cfg.name = "fashion_mnist";
    cfg.root = dir_.string();
    cfg.normalize = normalize;
    return cfg;
  }

  std::string error_of(const config::DataConfig& cfg) {
    try {
      make(cfg, /*seed=*/0);
    } catch (const DataError& e) {
      return e.what();
    } catch (const DataConfigError& e) {
      EXPECT_EQ(e.key(), "data.root");
      return e.what();
    }
    ADD_FAILURE() << "no DataError";
    return "";
  }

  test_support::TempDir tmp_{"fmnist"};
  const fs::path& dir_ = tmp_.path();
};

TEST_F(FashionMnistTest, TinyDataset) {
  write_split("train", 10, 10);
  write_split("t10k", 4, 4);
  const Splits s = make(config(/*normalize=*/false), /*seed=*/0);
  EXPECT_EQ(s.train->size(), 10);
  EXPECT_EQ(s.val->size(), 4);
  EXPECT_EQ(s.spec.sample_shape, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(s.spec.num_classes, 10);
  const Batch b = s.train->get({9, 0, 3});
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
  EXPECT_EQ(b.inputs.dtype(), torch::kFloat32);
  EXPECT_EQ(b.targets.dtype(), torch::kInt64);
  EXPECT_EQ(b.targets[0].item<int64_t>(), 9);
  EXPECT_EQ(b.targets[1].item<int64_t>(), 0);
  EXPECT_EQ(b.targets[2].item<int64_t>(), 3);
  EXPECT_GE(b.inputs.min().item<float>(), 0.0f);
  EXPECT_LE(b.inputs.max().item<float>(), 1.0f);
  // Pixel (0, 0, 1) of image 0 is 13 / 255.
  EXPECT_FLOAT_EQ(b.inputs[1][0][0][1].item<float>(), 13.0f / 255.0f);
}

TEST_F(FashionMnistTest, NormalizedWithTrainingStatistics) {
  write_split("train", 10, 10);
  write_split("t10k", 4, 4);
  const Splits s = make(config(/*normalize=*/true), /*seed=*/0);
  std::vector<int64_t> all(10);
  for (int64_t i = 0; i < 10; ++i) all[static_cast<size_t>(i)] = i;
  const auto x = s.train->get(all).inputs.to(torch::kFloat64);
  EXPECT_NEAR(x.mean().item<double>(), 0.0, 1e-4);
  EXPECT_NEAR(x.std(/*unbiased=*/false).item<double>(), 1.0, 1e-4);
}

TEST_F(FashionMnistTest, MissingDirectory) {
  auto cfg = config(/*normalize=*/true);
  cfg.root = (dir_ / "absent").string();
  const std::string msg = error_of(cfg);
  EXPECT_NE(msg.find(cfg.root), std::string::npos) << msg;
  EXPECT_NE(msg.find("install the Debian package dataset-fashion-mnist or set data.root"),
            std::string::npos)
      << msg;
}

TEST_F(FashionMnistTest, MissingFile) {
  write_split("train", 10, 10);
  const std::string msg = error_of(config(/*normalize=*/true));
  EXPECT_NE(msg.find("t10k-images-idx3-ubyte"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir_.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataset-fashion-mnist"), std::string::npos) << msg;
}

TEST_F(FashionMnistTest, LabelCountMismatch) {
  write_split("train", 10, 9);
  write_split("t10k", 4, 4);
  const std::string msg = error_of(config(/*normalize=*/true));
  EXPECT_NE(msg.find("train-labels-idx1-ubyte.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("9 labels for 10 images"), std::string::npos) << msg;
}

TEST_F(FashionMnistTest, LabelOutOfRange) {
  write_split("train", 10, 10);
  write_split("t10k", 4, 4);
  write_bytes(dir_ / "t10k-labels-idx1-ubyte", idx_bytes(0x08, {4}, {0, 1, 10, 2}), false);
  const std::string msg = error_of(config(/*normalize=*/true));
  EXPECT_NE(msg.find("label 10"), std::string::npos) << msg;
}

TEST_F(FashionMnistTest, TruncatedFileIsDataError) {
  write_split("train", 10, 10);
  write_split("t10k", 4, 4);
  auto bytes = idx_bytes(0x08, {4, 28, 28}, std::vector<uint8_t>(100));
  write_bytes(dir_ / "t10k-images-idx3-ubyte", bytes, false);
  const std::string msg = error_of(config(/*normalize=*/true));
  EXPECT_NE(msg.find("truncated: expected 3136 bytes of data, found 100"), std::string::npos)
      << msg;
}

TEST_F(FashionMnistTest, RealData) {
  const std::string root = "/usr/share/datasets/fashion-mnist";
  if (!fs::is_directory(root)) GTEST_SKIP() << root << " absent";
  config::DataConfig cfg = default_data_config();
  cfg.name = "fashion_mnist";
  cfg.root = "";  // the default
  const Splits s = make(cfg, /*seed=*/0);
  EXPECT_EQ(s.train->size(), 60000);
  EXPECT_EQ(s.val->size(), 10000);
  EXPECT_EQ(s.spec.sample_shape, (std::vector<int64_t>{1, 28, 28}));
  const Batch b = s.val->get({0, 9999});
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{2, 1, 28, 28}));
  EXPECT_EQ(b.targets[0].item<int64_t>(), 9);  // the first test image is an ankle boot
}

// --- Loader ----------------------------------------------------------------------------------

// Sample i is the value i: inputs [B, 1] float32, targets [B] int64.
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(int64_t n, int64_t throw_at = -1, int delay_ms = 0)
      : n_(n), throw_at_(throw_at), delay_ms_(delay_ms) {}
  int64_t size() const override { return n_; }

 protected:
  Batch fetch(const std::vector<int64_t>& indices, const Epoch& /*epoch*/) const override {
    if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    for (int64_t i : indices) {
      if (i == throw_at_) throw std::runtime_error("bad sample " + std::to_string(i));
    }
    auto t = torch::tensor(indices, torch::kInt64);
    return Batch{t.to(torch::kFloat32).unsqueeze(1), t};
  }

 private:
  int64_t n_;
  int64_t throw_at_;
  int delay_ms_;
};

LoaderOptions options(int64_t batch, int64_t workers, bool drop_last, bool shuffle = true) {
  LoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.drop_last = drop_last;
  o.shuffle = shuffle;
  o.seed = 42;
  return o;
}

// The batches of one epoch, each as its list of indices.
std::vector<std::vector<int64_t>> epoch(Loader& loader, int64_t e, int64_t first = 0) {
  loader.start_epoch(e, first);
  std::vector<std::vector<int64_t>> out;
  while (auto b = loader.next()) {
    EXPECT_TRUE(torch::equal(b->inputs.squeeze(1).to(torch::kInt64), b->targets));
    out.emplace_back(b->targets.data_ptr<int64_t>(),
                     b->targets.data_ptr<int64_t>() + b->targets.numel());
  }
  return out;
}

TEST(LoaderTest, CoversEveryIndexOnceWithoutDropLast) {
  for (int64_t workers : {0, 2}) {
    Loader loader(std::make_shared<IndexDataset>(103), options(10, workers, /*drop_last=*/false));
    EXPECT_EQ(loader.batches_per_epoch(), 11);
    EXPECT_EQ(loader.samples_per_epoch(), 103);
    const auto batches = epoch(loader, 0);
    ASSERT_EQ(batches.size(), 11u);
    EXPECT_EQ(batches.back().size(), 3u);
    std::multiset<int64_t> seen;
    for (const auto& b : batches) seen.insert(b.begin(), b.end());
    EXPECT_EQ(seen.size(), 103u);
    for (int64_t i = 0; i < 103; ++i) EXPECT_EQ(seen.count(i), 1u);
  }
}

// Uneven shards (evaluation): over any number of ranks every sample once, none repeated, the
// last ranks one fewer when the ranks do not divide the data.
TEST(LoaderTest, UnevenShardsCoverEverySampleOnceOverTheRanks) {
  for (int64_t world : {1, 2, 3, 7}) {
    std::multiset<int64_t> seen;
    for (int64_t rank = 0; rank < world; ++rank) {
      auto o = options(4, /*workers=*/1, /*drop_last=*/false, /*shuffle=*/false);
      o.even = false;
      o.rank = rank;
      o.world_size = world;
      Loader loader(std::make_shared<IndexDataset>(101), o);
      const int64_t mine = (101 - rank + world - 1) / world;
      EXPECT_EQ(loader.samples_per_epoch(), mine);
      for (const auto& b : epoch(loader, 0)) seen.insert(b.begin(), b.end());
    }
    EXPECT_EQ(seen.size(), 101u) << world << " ranks";
    for (int64_t i = 0; i < 101; ++i) EXPECT_EQ(seen.count(i), 1u) << i;
  }
}

TEST(LoaderTest, DropLastDropsTheTail) {
  Loader loader(std::make_shared<IndexDataset>(103), options(10, 0, /*drop_last=*/true));
  EXPECT_EQ(loader.batches_per_epoch(), 10);
  EXPECT_EQ(loader.samples_per_epoch(), 100);
  const auto batches = epoch(loader, 0);
  ASSERT_EQ(batches.size(), 10u);
  for (const auto& b : batches) EXPECT_EQ(b.size(), 10u);
}

TEST(LoaderTest, NoShuffleIsIdentity) {
  Loader loader(std::make_shared<IndexDataset>(25), options(10, 2, false, /*shuffle=*/false));
  const auto batches = epoch(loader, 3);
  std::vector<int64_t> flat;
  for (const auto& b : batches) flat.insert(flat.end(), b.begin(), b.end());
  for (int64_t i = 0; i < 25; ++i) EXPECT_EQ(flat[static_cast<size_t>(i)], i);
}

TEST(LoaderTest, OrderIndependentOfWorkers) {
  auto data = std::make_shared<IndexDataset>(257);
  Loader serial(data, options(16, 0, false));
  Loader parallel(data, options(16, 3, false));
  for (int64_t e : {0, 1, 5}) EXPECT_EQ(epoch(serial, e), epoch(parallel, e)) << "epoch " << e;
}

TEST(LoaderTest, EpochsDiffer) {
  Loader loader(std::make_shared<IndexDataset>(100), options(10, 0, true));
  const auto a = epoch(loader, 0);
  const auto b = epoch(loader, 1);
  EXPECT_NE(a, b);
  EXPECT_EQ(a, epoch(loader, 0));
}

TEST(LoaderTest, DoesNotTouchGlobalGenerator) {
  torch::manual_seed(9);
  const auto before = torch::rand({4});
  torch::manual_seed(9);
  Loader loader(std::make_shared<IndexDataset>(100), options(10, 2, true));
  epoch(loader, 0);
  EXPECT_TRUE(torch::equal(before, torch::rand({4})));
}

TEST(LoaderTest, StartEpochSkipsBatches) {
  for (int64_t workers : {0, 3}) {
    Loader loader(std::make_shared<IndexDataset>(95), options(10, workers, false));
    const auto full = epoch(loader, 2);
    for (int64_t k : {0, 1, 4, 9, 10}) {
      const auto tail = epoch(loader, 2, k);
      EXPECT_EQ(tail, std::vector<std::vector<int64_t>>(full.begin() + k, full.end()))
          << "k " << k << " workers " << workers;
    }
    EXPECT_THROW(loader.start_epoch(2, 11), std::out_of_range);
  }
}

TEST(LoaderTest, RestartMidEpoch) {
  Loader loader(std::make_shared<IndexDataset>(200), options(10, 3, true));
  const auto full = epoch(loader, 1);
  loader.start_epoch(0);
  ASSERT_TRUE(loader.next().has_value());
  ASSERT_TRUE(loader.next().has_value());
  EXPECT_EQ(epoch(loader, 1), full);
}

TEST(LoaderTest, DestroyMidEpochDoesNotHang) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) {
    Loader loader(std::make_shared<IndexDataset>(1000, -1, /*delay_ms=*/5), options(10, 4, true));
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
  }
  {
    // Started but never read.
    Loader loader(std::make_shared<IndexDataset>(1000, -1, /*delay_ms=*/5), options(10, 4, true));
    loader.start_epoch(0);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(LoaderTest, ExceptionSurfacesFromNext) {
  for (int64_t workers : {0, 2}) {
    Loader loader(std::make_shared<IndexDataset>(50, /*throw_at=*/25),
                  options(5, workers, true, /*shuffle=*/false));
    loader.start_epoch(0);
    for (int k = 0; k < 5; ++k) ASSERT_TRUE(loader.next().has_value());
    try {
      loader.next();
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "bad sample 25");
    }
  }
}

TEST(LoaderTest, NextBeforeStartEpochThrows) {
  Loader loader(std::make_shared<IndexDataset>(10), options(5, 0, true));
  EXPECT_THROW(loader.next(), std::logic_error);
}

TEST(LoaderTest, RejectsBadOptions) {
  auto data = std::make_shared<IndexDataset>(10);
  EXPECT_THROW(Loader(data, options(0, 0, true)), std::invalid_argument);
  EXPECT_THROW(Loader(data, options(5, -1, true)), std::invalid_argument);
}

// --- Sharding ----------------------------------------------------------------------------------

TEST(ShardTest, PartitionsAnEpochExactlyAcrossRanks) {
  for (int64_t n : {10, 11, 12, 2}) {
    for (int64_t world : {1, 2, 3}) {
      for (bool drop_last : {false, true}) {
        std::multiset<int64_t> seen;
        size_t per_rank = 0;
        for (int64_t rank = 0; rank < world; ++rank) {
          const auto mine =
              shard_order(n, /*shuffle=*/true, drop_last, /*seed=*/4, /*epoch=*/1, rank, world);
          if (rank == 0) per_rank = mine.size();
          EXPECT_EQ(mine.size(), per_rank) << "every rank takes as many steps";
          seen.insert(mine.begin(), mine.end());
        }
        const std::string where = "n " + std::to_string(n) + " world " + std::to_string(world) +
                                  (drop_last ? " drop_last" : " padded");
        if (drop_last) {
          // Disjoint, n - n % world samples, none twice.
          EXPECT_EQ(per_rank, static_cast<size_t>(n / world)) << where;
          EXPECT_EQ(seen.size(), static_cast<size_t>(n - n % world)) << where;
          for (int64_t i : seen) EXPECT_EQ(seen.count(i), 1u) << where;
        } else {
          // Every sample at least once; the padding repeats at most world - 1 of them.
          EXPECT_EQ(per_rank, static_cast<size_t>((n + world - 1) / world)) << where;
          for (int64_t i = 0; i < n; ++i) EXPECT_GE(seen.count(i), 1u) << where << " i " << i;
          EXPECT_EQ(seen.size() - static_cast<size_t>(n),
                    static_cast<size_t>((world - n % world) % world))
              << where;
        }
      }
    }
  }
}

TEST(ShardTest, OneRankIsTheWholeEpochAndEpochsReshuffle) {
  const auto all = shard_order(50, true, false, 9, 0, 0, 1);
  std::vector<int64_t> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_NE(all, shard_order(50, true, false, 9, 1, 0, 1));
  // Ranks interleave the same epoch order.
  const auto r1 = shard_order(50, true, false, 9, 0, 1, 2);
  for (size_t i = 0; i < r1.size(); ++i) EXPECT_EQ(r1[i], all[2 * i + 1]);
  EXPECT_THROW(shard_order(50, true, false, 9, 0, 2, 2), std::invalid_argument);
}

TEST(ShardTest, LoaderServesItsRanksShard) {
  auto data = std::make_shared<IndexDataset>(23);
  std::multiset<int64_t> seen;
  for (int64_t rank = 0; rank < 3; ++rank) {
    auto o = options(4, /*workers=*/2, /*drop_last=*/false);
    o.rank = rank;
    o.world_size = 3;
    Loader loader(data, o);
    EXPECT_EQ(loader.samples_per_epoch(), 8);
    EXPECT_EQ(loader.batches_per_epoch(), 2);
    for (const auto& b : epoch(loader, 2)) seen.insert(b.begin(), b.end());
  }
  EXPECT_EQ(seen.size(), 24u);
  for (int64_t i = 0; i < 23; ++i) EXPECT_GE(seen.count(i), 1u);
  auto bad = options(4, 0, false);
  bad.rank = 3;
  bad.world_size = 3;
  EXPECT_THROW(Loader(data, bad), std::invalid_argument);
}

// --- In-memory image augmentation and CIFAR-10 ----------------------------------------------

// [N, C, H, W] uint8 with distinct values.
torch::Tensor test_images(int64_t n, int64_t c, int64_t h, int64_t w) {
  return torch::arange(n * c * h * w, torch::kInt64)
      .remainder(251)
      .add(1)
      .to(torch::kUInt8)
      .view({n, c, h, w});
}

TEST(MemoryImagesTest, FlipAndPaddedCropAreShiftsOfTheImage) {
  const auto images = test_images(6, 2, 5, 7);
  const auto labels = torch::arange(6, torch::kInt64);
  ImageTransform plain;
  const MemoryImages base("t", images, labels, plain);
  ImageTransform flip;
  flip.hflip = 1.0;
  const MemoryImages flipped("t", images, labels, flip);
  const std::vector<int64_t> all = {0, 1, 2, 3, 4, 5};
  const auto x = base.get(all).inputs;  // [6, 2, 5, 7] in [0, 1]
  EXPECT_TRUE(torch::allclose(x, images.to(torch::kFloat32) / 255.0));
  EXPECT_TRUE(torch::equal(flipped.get(all).inputs, x.flip({3})));

  ImageTransform crop;
  crop.crop_padding = 2;
  const MemoryImages cropped("t", images, labels, crop);
  std::set<std::pair<int64_t, int64_t>> shifts;
  for (int64_t epoch = 0; epoch < 8; ++epoch) {
    const auto y = cropped.get(all, Epoch{5, epoch}).inputs;
    for (int64_t i = 0; i < 6; ++i) {
      // Exactly one shift (dy, dx) in [-2, 2]^2 with zero fill reproduces the sample.
      int matches = 0;
      for (int64_t dy = -2; dy <= 2; ++dy) {
        for (int64_t dx = -2; dx <= 2; ++dx) {
          auto padded = torch::constant_pad_nd(x[i], {2, 2, 2, 2}, 0.0);  // [2, 9, 11]
          auto window = padded.slice(1, 2 + dy, 2 + dy + 5).slice(2, 2 + dx, 2 + dx + 7);
          if (torch::equal(window, y[i])) {
            ++matches;
            shifts.insert({dy, dx});
          }
        }
      }
      EXPECT_EQ(matches, 1) << "epoch " << epoch << " sample " << i;
    }
  }
  EXPECT_GT(shifts.size(), 10u);
  // A sample's draw depends on (seed, epoch, index) only, not on the rest of the batch.
  EXPECT_TRUE(torch::equal(cropped.get({4}, Epoch{5, 3}).inputs[0],
                           cropped.get(all, Epoch{5, 3}).inputs[4]));
}

TEST(MemoryImagesTest, NormalisesPerChannel) {
  const auto images = test_images(4, 3, 4, 4);
  std::vector<double> mean, std;
  channel_stats(images, mean, std);
  ASSERT_EQ(mean.size(), 3u);
  ImageTransform t;
  t.mean = mean;
  t.std = std;
  const MemoryImages d("t", images, torch::zeros({4}, torch::kInt64), t);
  const auto x = d.get({0, 1, 2, 3}).inputs.to(torch::kFloat64);  // [4, 3, 4, 4]
  for (int64_t c = 0; c < 3; ++c) {
    auto ch = x.select(1, c);
    EXPECT_NEAR(ch.mean().item<double>(), 0.0, 1e-5);
    EXPECT_NEAR(ch.std(/*unbiased=*/false).item<double>(), 1.0, 1e-5);
  }
}

class Cifar10Test : public ::testing::Test {
 protected:
  // `records` records with label i % 10 and pixel bytes (i + j) % 256.
  void write_batch(const std::string& name, int records, int64_t truncate = 0) {
    std::vector<uint8_t> bytes;
    for (int i = 0; i < records; ++i) {
      bytes.push_back(static_cast<uint8_t>(i % 10));
      for (int j = 0; j < 3072; ++j) bytes.push_back(static_cast<uint8_t>((i + j) % 256));
    }
    bytes.resize(bytes.size() - static_cast<size_t>(truncate));
    fs::create_directories(tmp_ / "cifar-10-batches-bin");
    write_bytes(tmp_ / "cifar-10-batches-bin" / name, bytes, /*gzip=*/false);
  }
  void write_all() {
    for (int k = 1; k <= 5; ++k) write_batch("data_batch_" + std::to_string(k) + ".bin", 3);
    write_batch("test_batch.bin", 4);
  }
  config::DataConfig config() const {
    config::DataConfig cfg = default_data_config();
    cfg.name = "cifar10";
    cfg.root = tmp_.path().string();  // the archive's parent folder
    cfg.normalize = false;
    return cfg;
  }
  test_support::TempDir tmp_{"cifar"};
};

TEST_F(Cifar10Test, ReadsTheBinaryVersion) {
  write_all();
  const Splits s = make(config(), 0);
  EXPECT_EQ(s.train->size(), 15);
  EXPECT_EQ(s.val->size(), 4);
  EXPECT_EQ(s.spec.sample_shape, (std::vector<int64_t>{3, 32, 32}));
  EXPECT_EQ(s.spec.num_classes, 10);
  const Batch b = s.train->get({4});  // record 1 of data_batch_2
  EXPECT_EQ(b.targets[0].item<int64_t>(), 1);
  // Planar RGB: channel c, row y, column x is byte 1 + c * 1024 + y * 32 + x of the record.
  const int64_t c = 2, y = 3, x = 5, j = c * 1024 + y * 32 + x;
  EXPECT_FLOAT_EQ(b.inputs[0][c][y][x].item<float>(), static_cast<float>((1 + j) % 256) / 255.0f);
}

TEST_F(Cifar10Test, WrongSizeNamesTheFile) {
  write_all();
  write_batch("data_batch_3.bin", 3, /*truncate=*/100);
  try {
    make(config(), 0);
    ADD_FAILURE() << "no DataError";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("data_batch_3.bin: 9119 bytes is not a whole number of CIFAR-10 records"),
              std::string::npos)
        << msg;
  }
  auto cfg = config();
  cfg.root = (tmp_ / "absent").string();
  try {
    make(cfg, 0);
    ADD_FAILURE() << "no DataConfigError";
  } catch (const DataConfigError& e) {
    EXPECT_EQ(e.key(), "data.root");
  }
}

}  // namespace
// Shard patterns expand as webdataset's braceexpand does.
TEST(Shards, BracePatternsExpandAsBraceexpand) {
  EXPECT_EQ(expand_braces("train-{000008..000010}.tar"),
            (std::vector<std::string>{"train-000008.tar", "train-000009.tar", "train-000010.tar"}));
  EXPECT_EQ(expand_braces("{a,b}/{1..2}.tar"),
            (std::vector<std::string>{"a/1.tar", "a/2.tar", "b/1.tar", "b/2.tar"}));
  EXPECT_EQ(expand_braces("plain.tar"), std::vector<std::string>{"plain.tar"});
  EXPECT_THROW(expand_braces("train-{000..003.tar"), std::invalid_argument);
  EXPECT_THROW(expand_braces("train-{a..c}.tar"), std::invalid_argument);
  EXPECT_THROW(expand_braces("train-000}.tar"), std::invalid_argument);
}

// Reversed ranges count down and ranges pad as bash and braceexpand do (the reference values are
// braceexpand 0.1.7's); a pattern naming more than a million files is refused before any name is
// made, naming the range.
TEST(Shards, BraceRangesCountDownPadAndAreCountedBeforeExpanding) {
  using Names = std::vector<std::string>;
  EXPECT_EQ(expand_braces("{3..1}.tar"), (Names{"3.tar", "2.tar", "1.tar"}));
  EXPECT_EQ(expand_braces("{000001..000000}"), (Names{"000001", "000000"}));
  EXPECT_EQ(expand_braces("{10..08}"), (Names{"10", "09", "08"}));
  EXPECT_EQ(expand_braces("{1..010}").front(), "001");
  EXPECT_EQ(expand_braces("{8..10}"), (Names{"8", "9", "10"}));
  EXPECT_EQ(expand_braces("{0..2}"), (Names{"0", "1", "2"}));
  EXPECT_EQ(expand_braces("s{1..0}-{a,b}"), (Names{"s1-a", "s1-b", "s0-a", "s0-b"}));
  EXPECT_EQ(expand_braces("{000000..999999}").size(), 1000000u);
  const auto error_of = [](const std::string& pattern) {
    try {
      expand_braces(pattern);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string huge = error_of("train-{000000..999999999}.tar");
  EXPECT_NE(huge.find("train-{000000..999999999}.tar: names more than 1000000 files "
                      "({000000..999999999} alone 1000000000)"),
            std::string::npos)
      << huge;
  // Several braces multiply: 2000 x 1000 is over the limit, each alone is not.
  const std::string product = error_of("{0..1999}/{000..999}.tar");
  EXPECT_NE(product.find("names more than 1000000 files, more shards"), std::string::npos)
      << product;
  EXPECT_NE(error_of("{0..999999999999999999}{0..999999999999999999}"), "no error");
}

// A mix of two synthetic sets (300 and 100 training samples) weighted 0.7 and 0.3.
config::DataConfig mix_config(const std::vector<int64_t>& second_shape = {1, 28, 28}) {
  config::DataConfig cfg = default_data_config("mix");
  cfg.mix.prototype.options = dataset_registry().options();
  for (const auto& [samples, weight] : {std::pair<int64_t, double>{300, 0.7}, {100, 0.3}}) {
    config::MixPart part = cfg.mix.prototype;
    part.name = "synthetic";
    part.weight = weight;
    part.options.set("train_samples", samples);
    part.options.set("val_samples", samples / 10);
    if (samples == 100) part.options.set("shape", second_shape);
    cfg.mix.items.push_back(part);
  }
  return cfg;
}

// Parts are drawn in proportion to their weights at every prefix of an epoch; a part's draws
// walk its own shuffled order across epochs, a new pass only when it is used up.
TEST(Mix, DrawsEachPartInProportionAndWalksItsOrderAcrossEpochs) {
  const auto splits = dataset_registry().get("mix")(mix_config(), DataContext{});
  ASSERT_EQ(splits.train->size(), 400);
  EXPECT_EQ(splits.val->size(), 40);
  std::vector<int64_t> firsts, seconds;  // the draws of each part, over two epochs
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const auto order = splits.train->order(/*shuffle=*/true, /*seed=*/5, epoch);
    ASSERT_EQ(order.size(), 400u);
    int64_t first = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      (order[i] < 300 ? firsts : seconds).push_back(order[i]);
      first += order[i] < 300;
      ASSERT_LE(std::abs(static_cast<double>(first) - 0.7 * static_cast<double>(i + 1)), 1.0)
          << "position " << i;
    }
    EXPECT_EQ(first, 280);
  }
  ASSERT_EQ(firsts.size(), 560u);
  // The first part's first pass: 280 draws in epoch 0 and 20 in epoch 1, each sample once.
  EXPECT_EQ(std::set<int64_t>(firsts.begin(), firsts.begin() + 300).size(), 300u);
  EXPECT_EQ(*std::min_element(firsts.begin(), firsts.end()), 0);
  // The second part: 120 draws an epoch; its passes of 100 are permutations of 300..399.
  for (size_t pass = 0; pass < 2; ++pass) {
    std::set<int64_t> once(seconds.begin() + 100 * pass, seconds.begin() + 100 * (pass + 1));
    EXPECT_EQ(once.size(), 100u);
    EXPECT_EQ(*once.begin(), 300);
    EXPECT_EQ(*once.rbegin(), 399);
  }
  EXPECT_NE(std::vector<int64_t>(seconds.begin(), seconds.begin() + 100),
            std::vector<int64_t>(seconds.begin() + 100, seconds.begin() + 200));
  EXPECT_EQ(splits.train->order(true, 5, 1), splits.train->order(true, 5, 1));
  EXPECT_NE(splits.train->order(true, 5, 1), splits.train->order(true, 6, 1));

  // A batch holds each part's own samples at their places.
  config::DataConfig second = default_data_config("synthetic");
  second.options.set("train_samples", int64_t{100});
  second.options.set("val_samples", int64_t{10});
  const auto alone = dataset_registry().get("synthetic")(second, DataContext{});
  const Batch mixed = splits.train->get({310, 2, 399});
  const Batch own = alone.train->get({10, 99});
  EXPECT_TRUE(torch::equal(mixed.inputs[0], own.inputs[0]));
  EXPECT_TRUE(torch::equal(mixed.inputs[2], own.inputs[1]));
  EXPECT_EQ(mixed.targets[2].item<int64_t>(), own.targets[1].item<int64_t>());
  EXPECT_FALSE(torch::equal(mixed.inputs[1], own.inputs[0]));
}

// A part of a mix: `name` with its keys set from `keys` (integers) and `root`.
config::MixPart mix_part(const config::DataConfig& cfg, const std::string& name,
                         const std::string& root,
                         const std::vector<std::pair<std::string, int64_t>>& keys) {
  config::MixPart part = cfg.mix.prototype;
  part.name = name;
  part.root = root;
  part.weight = 0.5;
  for (const auto& [key, value] : keys) part.options.set(key, value);
  part.options.set("shape", std::vector<int64_t>{3, 8, 8});
  return part;
}

// Labels must mean the same classes in every part: a part with another number of classes
// (webdataset's unnamed labels 0..3 beside an image folder's a, b), or other names, is a config
// error at start naming both parts and their classes; a part without names that agrees in number
// takes the named part's.
TEST(Mix, PartsThatDisagreeOnTheirClassesAreConfigErrorsNamingBoth) {
  test_support::TempDir tmp("mix-classes");
  for (const auto& [folder, classes] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{{"ab", {"a", "b"}},
                                                                     {"ac", {"a", "c"}}}) {
    for (const char* split : {"train", "val"}) {
      for (const auto& cls : classes) {
        fs::create_directories(tmp / folder / split / cls);
        test_support::write_file((tmp / folder / split / cls / "0.png").string(),
                                 test_support::encode_png(test_support::ramp_image(8, 8), 8, 8));
      }
    }
  }
  config::DataConfig cfg = default_data_config("mix");
  cfg.mix.prototype.options = dataset_registry().options();
  const std::vector<std::pair<std::string, int64_t>> image = {{"image_size", 8},
                                                              {"resize_size", 8}};
  const auto folder = [&](const std::string& root) {
    return mix_part(cfg, "imagefolder", (tmp / root).string(), image);
  };
  const auto synthetic = [&](int64_t classes) {
    return mix_part(cfg, "synthetic", "", {{"num_classes", classes}, {"train_samples", 20}});
  };
  const auto error_of = [&](std::vector<config::MixPart> parts) {
    cfg.mix.items = std::move(parts);
    try {
      dataset_registry().get("mix")(cfg, DataContext{});
    } catch (const DataConfigError& e) {
      return e.key() + ": " + e.message();
    }
    return std::string("no error");
  };
  std::string e = error_of({synthetic(4), folder("ab")});
  EXPECT_EQ(e.rfind("data.mix: data.mix[1] (imagefolder) has 2 classes (a, b), data.mix[0] "
                    "(synthetic) 4 classes, unnamed (labels 0..3): a label would mean another "
                    "class",
                    0),
            0u)
      << e;
  e = error_of({folder("ab"), folder("ac")});
  EXPECT_EQ(e.rfind("data.mix: data.mix[0] (imagefolder) has 2 classes (a, b), data.mix[1] "
                    "(imagefolder) 2 classes (a, c)",
                    0),
            0u)
      << e;
  e = error_of({folder("ab"), synthetic(2), synthetic(3)});
  EXPECT_NE(e.find("data.mix[2] (synthetic) 3 classes, unnamed"), std::string::npos) << e;
  cfg.mix.items = {synthetic(2), folder("ab")};
  const auto splits = dataset_registry().get("mix")(cfg, DataContext{});
  EXPECT_EQ(splits.spec.num_classes, 2);
  EXPECT_EQ(splits.spec.class_names, (std::vector<std::string>{"a", "b"}));
}

// Token ids must mean the same tokens in every part: a part that knows its vocabulary (text read
// as bytes: 256; synthetic_tokens: data.num_classes; chat: its tokenizer's) beside one of another
// size, or beside a token file whose ids reach past it, is a config error naming both parts and
// their sizes. Token files that only show their largest id may differ in it.
TEST(Mix, TokenSetsOfDifferentVocabulariesAreConfigErrorsNamingBoth) {
  test_support::TempDir tmp("mix-vocab");
  const auto token_file = [&](const std::string& name, uint16_t largest) {
    std::vector<uint8_t> bytes;
    for (int i = 0; i < 400; ++i) {
      const auto id = static_cast<uint16_t>(i * 37 % (largest + 1));
      bytes.push_back(static_cast<uint8_t>(id & 0xFF));
      bytes.push_back(static_cast<uint8_t>(id >> 8));
    }
    bytes[0] = static_cast<uint8_t>(largest & 0xFF);
    bytes[1] = static_cast<uint8_t>(largest >> 8);
    test_support::write_file((tmp / name).string(), bytes);
    return (tmp / name).string();
  };
  const std::string ids999 = token_file("a.bin", 999), ids500 = token_file("b.bin", 500);
  test_support::write_file((tmp / "text.txt").string(), std::vector<uint8_t>(400, 'x'));
  config::DataConfig cfg = default_data_config("mix");
  cfg.mix.prototype.options = dataset_registry().options();
  const auto tokens = [&](const std::string& root) {
    return mix_part(cfg, "tokens", root, {{"seq_len", 8}});
  };
  const auto synthetic = [&](int64_t vocab) {
    return mix_part(cfg, "synthetic_tokens", "",
                    {{"num_classes", vocab}, {"seq_len", 8}, {"train_samples", 20}});
  };
  const auto error_of = [&](std::vector<config::MixPart> parts) {
    cfg.mix.items = std::move(parts);
    try {
      dataset_registry().get("mix")(cfg, DataContext{});
    } catch (const DataConfigError& e) {
      return e.key() + ": " + e.message();
    }
    return std::string("no error");
  };
  const std::string text = (tmp / "text.txt").string();
  std::string e = error_of({tokens(text), tokens(ids999)});
  EXPECT_EQ(e.rfind("data.mix: data.mix[0] (tokens) has a vocabulary of 256 tokens, data.mix[1] "
                    "(tokens) token ids up to 999: a token id would mean another token",
                    0),
            0u)
      << e;
  e = error_of({synthetic(64), tokens(text)});
  EXPECT_EQ(e.rfind("data.mix: data.mix[0] (synthetic_tokens) has a vocabulary of 64 tokens, "
                    "data.mix[1] (tokens) a vocabulary of 256 tokens",
                    0),
            0u)
      << e;
  // The largest ids of two token files differ; each fits a known vocabulary at least as large.
  cfg.mix.items = {tokens(ids999), tokens(ids500), synthetic(1000)};
  auto splits = dataset_registry().get("mix")(cfg, DataContext{});
  EXPECT_EQ(splits.spec.num_classes, 1000);
  e = error_of({tokens(ids999), tokens(ids500), synthetic(900)});
  EXPECT_EQ(e.rfind("data.mix: data.mix[2] (synthetic_tokens) has a vocabulary of 900 tokens, "
                    "data.mix[0] (tokens) token ids up to 999",
                    0),
            0u)
      << e;
  cfg.mix.items = {tokens(ids999), tokens(ids500)};
  splits = dataset_registry().get("mix")(cfg, DataContext{});
  EXPECT_EQ(splits.spec.num_classes, 1000);
}

TEST(Mix, PartsThatDoNotFitAreConfigErrorsNamingThePart) {
  const auto error_of = [](const config::DataConfig& cfg) {
    try {
      dataset_registry().get("mix")(cfg, DataContext{});
    } catch (const DataConfigError& e) {
      return e.key() + ": " + e.message();
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(mix_config({1, 8, 8}))
                .find("data.mix: data.mix[1] (synthetic)'s samples are "
                      "[1, 8, 8], data.mix[0] (synthetic)'s [1, 28, 28]"),
            std::string::npos)
      << error_of(mix_config({1, 8, 8}));
  auto cfg = mix_config();
  cfg.mix.items[1].name = "cifar10";
  cfg.mix.items[1].root = "";
  EXPECT_EQ(error_of(cfg).rfind("data.mix[1].root: ", 0), 0u) << error_of(cfg);
  cfg.mix.items[1].name = "mixx";
  EXPECT_EQ(error_of(cfg).rfind("data.mix[1].name: unknown data set 'mixx'", 0), 0u)
      << error_of(cfg);
  cfg.mix.items.clear();
  EXPECT_EQ(error_of(cfg).rfind("data.mix: list the data sets", 0), 0u) << error_of(cfg);
}

}  // namespace trainer::data
