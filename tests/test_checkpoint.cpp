// Checkpoint files: the safetensors format, atomic writes, the manifest, verification, pruning.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "temp_dir.h"
#include "util/fileio.h"

namespace trainer::checkpoint {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> to_bytes(const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  std::vector<uint8_t> out;
  write_safetensors(tensors, metadata, [&](const void* p, size_t n) {
    out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  });
  return out;
}

TEST(SafetensorsTest, RoundTripsEveryDtypeAndMetadata) {
  NamedTensors in = {
      {"f32", torch::randn({3, 4})},
      {"f64", torch::randn({2}, torch::kFloat64)},
      {"f16", torch::randn({5}).to(torch::kFloat16)},
      {"bf16", torch::randn({2, 2}).to(torch::kBFloat16)},
      {"i64", torch::arange(7, torch::kInt64)},
      {"i32", torch::arange(3, torch::kInt32)},
      {"u8", torch::tensor({1, 2, 255}, torch::kUInt8)},
      {"bool", torch::tensor({true, false})},
      {"scalar", torch::tensor(3.5)},
      {"empty", torch::empty({0, 3})},
      {"strided", torch::randn({4, 6}).t()},  // non-contiguous input
  };
  const auto bytes = to_bytes(in, {{"k", "v"}});
  // The data section starts 8-byte aligned, after a JSON header.
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<size_t>(i)];
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  const auto out = parse_safetensors(bytes, "x");
  EXPECT_EQ(out.metadata.at("k"), "v");
  ASSERT_EQ(out.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out.tensors[i].first, in[i].first);
    EXPECT_EQ(out.tensors[i].second.scalar_type(), in[i].second.scalar_type()) << in[i].first;
    EXPECT_TRUE(torch::equal(out.tensors[i].second, in[i].second)) << in[i].first;
  }
}

TEST(SafetensorsTest, MalformedFilesAreFormatErrors) {
  const auto good = to_bytes({{"a", torch::ones({16})}, {"b", torch::zeros({4})}});
  auto error_of = [](std::vector<uint8_t> bytes) -> std::string {
    try {
      parse_safetensors(bytes, "w.safetensors");
    } catch (const FormatError& e) {
      return e.what();
    }
    return "no error";
  };
  auto truncated = good;
  truncated.resize(good.size() - 5);
  EXPECT_NE(error_of(truncated).find("w.safetensors: not a valid safetensors file"),
            std::string::npos);
  EXPECT_NE(error_of({1, 2, 3}).find("only 3 bytes"), std::string::npos);
  auto long_header = good;
  long_header[3] = 0x7F;
  EXPECT_NE(error_of(long_header).find("does not fit"), std::string::npos);
  auto not_json = good;
  not_json[8] = '[';
  EXPECT_NE(error_of(not_json).find("w.safetensors"), std::string::npos);
  auto extra = good;
  extra.push_back(0);
  EXPECT_NE(error_of(extra).find("1 bytes after the last tensor"), std::string::npos);
  EXPECT_THROW(to_bytes({{"a", torch::ones(1)}, {"a", torch::ones(1)}}), std::invalid_argument);
}

// A file of the given header (JSON) and `data` bytes after it.
std::vector<uint8_t> with_header(const std::string& json, size_t data = 0) {
  std::vector<uint8_t> out(8 + json.size() + data, 0);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(json.size() >> (8 * i));
  std::copy(json.begin(), json.end(), out.begin() + 8);
  return out;
}

// Crafted headers name the file and the field; nothing is allocated for sizes the file does not
// hold, even when the file claims 100 GB (sparse).
TEST(SafetensorsTest, CraftedHeadersNameTheFieldAndAllocateNothing) {
  test_support::TempDir tmp("st");
  auto error_of = [&](const std::vector<uint8_t>& bytes, uint64_t extend_to = 0) -> std::string {
    const std::string path = (tmp.path() / "w.safetensors").string();
    write_text_atomically(path, std::string(bytes.begin(), bytes.end()));
    if (extend_to > 0) fs::resize_file(path, extend_to);
    try {
      read_safetensors(path);
    } catch (const FormatError& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string f32 = R"("dtype":"F32",)";
  EXPECT_NE(error_of(with_header(R"({"a":{)" + f32 + R"("shape":[4],"data_offsets":"0"}})", 16))
                .find("w.safetensors: not a valid safetensors file: tensor 'a' has data_offsets"),
            std::string::npos);
  EXPECT_NE(error_of(with_header(R"({"a":{)" + f32 + R"("shape":[4],"data_offsets":[]}})", 16))
                .find("tensor 'a' has data_offsets []"),
            std::string::npos);
  EXPECT_NE(error_of(with_header(R"({"a":{)" + f32 + R"("shape":"4","data_offsets":[0,16]}})", 16))
                .find("tensor 'a' has shape \"4\""),
            std::string::npos);
  EXPECT_NE(error_of(with_header(R"({"a":{)" + f32 +
                                     R"("shape":[4294967296,4294967296],"data_offsets":[0,16]}})",
                                 16))
                .find("an overflowing number of bytes"),
            std::string::npos);
  // 100 GB, of which the header accounts for 16 bytes: rejected from the header alone.
  const auto sparse = error_of(
      with_header(R"({"a":{)" + f32 + R"("shape":[4],"data_offsets":[0,16]}})", 16), 100ull << 30);
  EXPECT_NE(sparse.find("bytes after the last tensor"), std::string::npos) << sparse;
}

class DirectoryTest : public ::testing::Test {
 protected:
  State state(int64_t step) const {
    State s;
    s.tensors = {{"w", torch::full({64}, static_cast<float>(step))}};
    s.meta = {{"step", step}};
    return s;
  }
  std::string dir() const { return (tmp_ / "checkpoints").string(); }
  test_support::TempDir tmp_{"ckpt"};
};

TEST_F(DirectoryTest, SavesLoadsAndKeepsTheLastAndTheBest) {
  Directory d(dir(), /*keep_last=*/2, /*keep_best=*/"top1");
  const std::vector<double> top1 = {0.5, 0.9, 0.6, 0.7, 0.8};
  for (int64_t step = 1; step <= 5; ++step) {
    d.save(step * 10, state(step * 10), {{"top1", top1[static_cast<size_t>(step - 1)]}});
  }
  std::vector<int64_t> steps;
  for (const auto& e : d.entries()) steps.push_back(e.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{20, 40, 50}));  // the best (0.9 at 20) and the last two
  EXPECT_FALSE(fs::exists(tmp_ / "checkpoints" / "step_00000010.safetensors"));
  EXPECT_FALSE(fs::exists(tmp_ / "checkpoints" / "step_00000030.safetensors"));
  auto latest = d.load_latest();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->second.meta["step"], 50);
  EXPECT_TRUE(torch::equal(latest->second.tensors[0].second, torch::full({64}, 50.0f)));
  // Lower is better for loss.
  Directory by_loss((tmp_ / "l").string(), 1, "loss");
  by_loss.save(1, state(1), {{"loss", 0.2}});
  by_loss.save(2, state(2), {{"loss", 0.4}});
  by_loss.save(3, state(3), {{"loss", 0.3}});
  EXPECT_EQ(by_loss.entries().front().step, 1);
  EXPECT_EQ(by_loss.entries().size(), 2u);
}

TEST_F(DirectoryTest, FallsBackWhenTheNewestIsTruncatedOrFlipped) {
  Directory d(dir(), 3, "");
  for (int64_t step : {1, 2, 3}) d.save(step, state(step), {});
  const auto newest = tmp_ / "checkpoints" / "step_00000003.safetensors";
  const auto middle = tmp_ / "checkpoints" / "step_00000002.safetensors";
  fs::resize_file(newest, fs::file_size(newest) - 10);
  auto latest = d.load_latest();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->second.meta["step"], 2);
  EXPECT_THROW(load(newest.string()), CorruptCheckpoint);
  {
    // One flipped bit in the tensor data: the structure still parses, the checksum does not.
    std::fstream f(middle, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-20, std::ios::end);
    char c;
    f.get(c);
    f.seekp(-20, std::ios::end);
    f.put(static_cast<char>(c ^ 0x01));
  }
  latest = d.load_latest();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->second.meta["step"], 1);
  try {
    load(middle.string());
    ADD_FAILURE() << "no CorruptCheckpoint";
  } catch (const CorruptCheckpoint& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  // None verifies: an error naming every file, not "no checkpoint".
  fs::remove(tmp_ / "checkpoints" / "step_00000001.safetensors");
  try {
    d.load_latest();
    ADD_FAILURE() << "no CorruptCheckpoint";
  } catch (const CorruptCheckpoint& e) {
    const std::string what = e.what();
    for (const char* name : {"step_00000001", "step_00000002", "step_00000003"}) {
      EXPECT_NE(what.find(name), std::string::npos) << what;
    }
  }
  EXPECT_FALSE(Directory((tmp_ / "empty").string(), 3, "").load_latest().has_value());
}

// JSON has no inf or NaN: such a metric is left out of the entry, the manifest stays readable.
TEST_F(DirectoryTest, NonFiniteMetricsStayOutOfTheManifest) {
  Directory d(dir(), 3, "loss");
  d.save(1, state(1), {{"loss", NAN}, {"top1", 0.5}});
  d.save(2, state(2), {{"loss", INFINITY}});
  const auto text = read_bytes((tmp_ / "checkpoints" / "manifest.json").string());
  const auto manifest = nlohmann::json::parse(text.begin(), text.end());
  EXPECT_EQ(manifest["checkpoints"].size(), 2u);
  const auto entries = d.entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].metrics, (std::map<std::string, double>{{"top1", 0.5}}));
  EXPECT_TRUE(entries[1].metrics.empty());
}

// A manifest that cannot be read does not mean "no checkpoints": the files are used, and the next
// save lists them again (the older ones are kept, not dropped).
TEST_F(DirectoryTest, AnUnreadableManifestFallsBackToTheFiles) {
  Directory d(dir(), 3, "");
  for (int64_t step : {1, 2, 3}) d.save(step, state(step), {});
  write_text_atomically((tmp_ / "checkpoints" / "manifest.json").string(), "{\"checkpoints\": [nu");
  auto latest = d.load_latest();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->second.meta["step"], 3);
  d.save(4, state(4), {});
  std::vector<int64_t> steps;
  for (const auto& e : d.entries()) steps.push_back(e.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_FALSE(fs::exists(tmp_ / "checkpoints" / "step_00000001.safetensors"));
}

// A whole checkpoint the manifest does not list (its writer was killed before the manifest) is
// entered and pruned as the listed ones are; a file that is not a checkpoint is left alone.
TEST_F(DirectoryTest, UnlistedCheckpointsAreAdoptedAndPruned) {
  Directory other((tmp_ / "other").string(), 3, "");
  const std::string written = other.save(2, state(2), {});
  Directory d(dir(), 2, "");
  d.save(1, state(1), {});
  fs::copy_file(written, tmp_ / "checkpoints" / "step_00000002.safetensors");
  std::ofstream(tmp_ / "checkpoints" / "step_00000009.safetensors") << "not a checkpoint";
  auto latest = d.load_latest();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->second.meta["step"], 2);
  for (int64_t step : {3, 4}) d.save(step, state(step), {});
  EXPECT_FALSE(fs::exists(tmp_ / "checkpoints" / "step_00000002.safetensors"));
  EXPECT_TRUE(fs::exists(tmp_ / "checkpoints" / "step_00000009.safetensors"));
  std::vector<int64_t> steps;
  for (const auto& e : d.entries()) steps.push_back(e.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 4}));
}

// A process killed between a checkpoint's file and its manifest entry leaves the file unlisted;
// the resuming writer enters it (and prunes as a save does).
TEST_F(DirectoryTest, EnteringUnlistedFilesListsWhatAKilledSaveLeft) {
  Directory other((tmp_ / "other").string(), 3, "");
  const std::string written = other.save(3, state(3), {});
  Directory d(dir(), 2, "");
  d.save(1, state(1), {});
  d.save(2, state(2), {});
  fs::copy_file(written, tmp_ / "checkpoints" / "step_00000003.safetensors");
  const auto listed = [&] {
    std::vector<std::string> files;
    std::ifstream in(tmp_ / "checkpoints" / "manifest.json");
    const auto manifest = nlohmann::json::parse(in);
    for (const auto& e : manifest["checkpoints"]) files.push_back(e["file"]);
    return files;
  };
  EXPECT_EQ(listed().size(), 2u);
  d.enter_unlisted();
  EXPECT_EQ(listed(),
            (std::vector<std::string>{"step_00000002.safetensors", "step_00000003.safetensors"}));
  EXPECT_FALSE(fs::exists(tmp_ / "checkpoints" / "step_00000001.safetensors"));
  d.enter_unlisted();  // nothing unlisted: unchanged
  EXPECT_EQ(listed().size(), 2u);
}

TEST_F(DirectoryTest, AFailedWriteLeavesThePreviousCheckpoint) {
  Directory d(dir(), 3, "");
  d.save(1, state(1), {});
  // The next checkpoint's name is taken by a directory: the rename fails.
  fs::create_directories(tmp_ / "checkpoints" / "step_00000002.safetensors" / "x");
  EXPECT_THROW(d.save(2, state(2), {}), IoError);
  ASSERT_EQ(d.entries().size(), 1u);
  EXPECT_EQ(d.load_latest()->second.meta["step"], 1);
  for (const auto& entry : fs::directory_iterator(tmp_ / "checkpoints")) {
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
  }
  // A directory that cannot be created.
  std::ofstream(tmp_ / "file") << "x";
  Directory blocked((tmp_ / "file" / "checkpoints").string(), 3, "");
  EXPECT_THROW(blocked.save(1, state(1), {}), IoError);
}

TEST_F(DirectoryTest, UnlistedFileLoadsWithoutChecksum) {
  Directory d(dir(), 3, "");
  const std::string path = d.save(7, state(7), {});
  fs::copy_file(path, tmp_ / "copy.safetensors");
  EXPECT_EQ(load((tmp_ / "copy.safetensors").string()).meta["step"], 7);
  // Not a checkpoint: plain weights.
  write_text_atomically(
      (tmp_ / "w.safetensors").string(),
      std::string(reinterpret_cast<const char*>(to_bytes({{"a", torch::ones(2)}}).data()),
                  to_bytes({{"a", torch::ones(2)}}).size()));
  EXPECT_THROW(load((tmp_ / "w.safetensors").string()), CorruptCheckpoint);
}

// One tensor under two names (a tied weight) is stored once, as safetensors' save_model stores
// shared tensors: the file holds the bytes once, the whole checkpoint and an fsdp shard alike, and
// loading gives both names, sharing one tensor. Equal tensors that are not one stay two.
TEST_F(DirectoryTest, ATensorUnderTwoNamesIsStoredOnceAndLoadedUnderBoth) {
  const auto wte = torch::arange(4096, torch::kFloat).view({64, 64});
  State s;
  s.tensors = {{"model.wte.weight", wte},
               {"model.lm_head.weight", wte},
               {"zeros_a", torch::zeros({256})},
               {"zeros_b", torch::zeros({256})}};
  s.meta = {{"step", 1}};
  Directory d(dir(), 1, "");
  const std::string path = d.save(1, s, {});
  const auto file = read_safetensors(path);
  EXPECT_EQ(file.tensors.size(), 3u);  // lm_head's name only in the metadata
  EXPECT_LT(fs::file_size(path), 4096u * 4u + 2u * 256u * 4u + 4096u);
  const State loaded = load(path);
  std::map<std::string, torch::Tensor> by_name(loaded.tensors.begin(), loaded.tensors.end());
  ASSERT_EQ(by_name.size(), 4u);
  EXPECT_TRUE(torch::equal(by_name.at("model.lm_head.weight"), wte));
  EXPECT_TRUE(by_name.at("model.lm_head.weight").is_same(by_name.at("model.wte.weight")));
  EXPECT_FALSE(by_name.at("zeros_a").is_same(by_name.at("zeros_b")));
  // An fsdp shard's pieces of one tensor under both names: stored once, assembled under both.
  const auto piece = wte.reshape({-1});
  const auto desc = write_shard(
      dir(), 2, 0, 1,
      {{"model.wte.weight", {64, 64}, 0, piece}, {"model.lm_head.weight", {64, 64}, 0, piece}});
  EXPECT_EQ(read_safetensors(dir() + "/" + desc.at("file").get<std::string>()).tensors.size(), 1u);
  State sharded;
  sharded.meta = {{"step", 2}, {"shards", nlohmann::json::array({desc})}};
  const State whole = load(d.save(2, sharded, {}));
  std::map<std::string, torch::Tensor> assembled(whole.tensors.begin(), whole.tensors.end());
  ASSERT_EQ(assembled.count("model.lm_head.weight"), 1u);
  EXPECT_TRUE(torch::equal(assembled.at("model.lm_head.weight"), wte));
  EXPECT_TRUE(torch::equal(assembled.at("model.wte.weight"), wte));
}

}  // namespace
}  // namespace trainer::checkpoint
