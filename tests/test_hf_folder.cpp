// Reading safetensors tensor by tensor (SafetensorsReader) and Hugging Face folders' weights.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/hf_folder.h"
#include "checkpoint/safetensors.h"
#include "temp_dir.h"
#include "util/fileio.h"

namespace trainer::checkpoint {
namespace {

namespace fs = std::filesystem;

void write_file(const std::string& path, const NamedTensors& tensors) {
  write_atomically(path, [&](const ByteSink& sink) { write_safetensors(tensors, {}, sink); });
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsReaderTest, ReadsChunksConvertedIntoAnyDestination) {
  test_support::TempDir tmp("st_reader");
  const std::string path = (tmp / "w.safetensors").string();
  const auto bf16 = torch::randn({25, 40}).to(torch::kBFloat16);  // 1000 elements
  const auto f32 = torch::randn({3, 7});
  write_file(path, {{"a", bf16}, {"b", f32}});
  const SafetensorsReader reader(path);
  ASSERT_EQ(reader.entries().size(), 2u);
  const auto* a = reader.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reader.find("c"), nullptr);
  // 64-byte chunks: 32 elements each, the last one partial.
  auto dst = torch::empty({25, 40});
  reader.read_into(*a, dst, /*chunk_bytes=*/64);
  EXPECT_TRUE(torch::equal(dst, bf16.to(torch::kFloat)));
  // A strided destination (a transposed view) gets the same values.
  auto base = torch::zeros({40, 25});
  auto strided = base.t();
  reader.read_into(*a, strided, 64);
  EXPECT_TRUE(torch::equal(base.t(), bf16.to(torch::kFloat)));
  // The file's own dtype: read in place.
  auto same = torch::empty({3, 7});
  reader.read_into(*reader.find("b"), same);
  EXPECT_TRUE(torch::equal(same, f32));
  EXPECT_TRUE(torch::equal(reader.read(*a), bf16));
  EXPECT_THROW(reader.read_into(*a, torch::empty({10})), std::invalid_argument);
}

// What a rank keeps of a tensor (an FSDP shard's range, a row of a split layer): elements
// [first, first + n) of the flattened tensor, converted or in the file's dtype.
TEST(SafetensorsReaderTest, ReadsARangeOfElementsConvertedOrAsTheyAre) {
  test_support::TempDir tmp("st_range");
  const std::string path = (tmp / "w.safetensors").string();
  const auto bf16 = torch::randn({25, 40}).to(torch::kBFloat16);  // 1000 elements
  write_file(path, {{"a", bf16}});
  const SafetensorsReader reader(path);
  const auto& a = *reader.find("a");
  const auto flat = bf16.reshape({-1});
  auto part = torch::zeros({333});
  reader.read_range_into(a, 517, part, /*chunk_bytes=*/64);  // 32-element chunks, one partial
  EXPECT_TRUE(torch::equal(part, flat.narrow(0, 517, 333).to(torch::kFloat)));
  auto same = torch::zeros({40}, torch::kBFloat16);
  reader.read_range_into(a, 960, same);  // the last row, in place
  EXPECT_TRUE(torch::equal(same, flat.narrow(0, 960, 40)));
  EXPECT_THROW(reader.read_range_into(a, 961, torch::empty({40})), std::invalid_argument);
  EXPECT_THROW(reader.read_range_into(a, 0, torch::empty({40, 2}).t()), std::invalid_argument);
}

TEST(SafetensorsReaderTest, ATruncatedFileFailsWhenOpenedNamingIt) {
  test_support::TempDir tmp("st_truncated");
  const std::string path = (tmp / "w.safetensors").string();
  write_file(path, {{"a", torch::randn({64})}});
  fs::resize_file(path, fs::file_size(path) - 4);
  const std::string error = error_of([&] { SafetensorsReader r(path); });
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
}

TEST(HfFolderTest, ShardsWrittenAreReadBackAndAMissingShardIsNamed) {
  test_support::TempDir tmp("hf_folder");
  const std::string dir = tmp.path().string();
  const NamedTensors tensors = {
      {"x", torch::randn({100})}, {"y", torch::randn({100})}, {"z", torch::randn({300})}};
  // 400 + 400 > 500: x and y in shards of their own; z (1200 bytes) alone in one, placed as
  // huggingface_hub places it: before the shard still being filled (x, z, y).
  const auto files = write_hf_weights(dir, tensors, 500);
  ASSERT_EQ(files.size(), 4u);  // three shards and the index
  EXPECT_EQ(files[0], "model-00001-of-00003.safetensors");
  const auto w = open_hf_weights(dir);
  ASSERT_EQ(w.tensors.size(), 3u);
  EXPECT_EQ(w.bytes, 2000u);
  for (const auto& [name, t] : tensors) {
    const auto& where = w.tensors.at(name);
    EXPECT_TRUE(torch::equal(w.files[where.file].read(*where.entry), t)) << name;
  }
  // Again into the same folder, all in one file: the shards and the index are removed.
  write_hf_weights(dir, tensors, 1u << 20);
  EXPECT_FALSE(fs::exists(tmp / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(tmp / "model-00001-of-00003.safetensors"));
  EXPECT_EQ(open_hf_weights(dir).tensors.size(), 3u);
  write_hf_weights(dir, tensors, 500);
  fs::remove(tmp / "model-00002-of-00003.safetensors");
  const std::string error = error_of([&] { open_hf_weights(dir); });
  EXPECT_NE(error.find("model.safetensors.index.json names shard model-00002-of-00003"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("holding z"), std::string::npos) << error;
}

// transformers' from_pretrained takes model.safetensors before model.safetensors.index.json: a
// folder with both (a sharded save into a folder that held one file) is read from the one file,
// the index and its shards neither read nor checked; the files listed are those read.
TEST(HfFolderTest, ModelSafetensorsComesBeforeAnIndexAsInTransformers) {
  test_support::TempDir tmp("hf_precedence");
  const std::string dir = tmp.path().string();
  const NamedTensors shards = {{"x", torch::randn({100})}, {"y", torch::randn({300})}};
  write_hf_weights(dir, shards, 500);  // two shards and the index
  const auto sharded = hf_weight_files(dir);
  ASSERT_EQ(sharded.size(), 3u);
  EXPECT_EQ(fs::path(sharded[2]).filename(), "model.safetensors.index.json");
  write_file((tmp / "model-extra.safetensors").string(), {{"q", torch::randn({4})}});
  EXPECT_EQ(hf_weight_files(dir), sharded);  // a file the index does not list is not read
  EXPECT_EQ(hf_files_read(open_hf_weights(dir)),
            "model.safetensors.index.json and its 2 shards (model-00001-of-00002.safetensors .. "
            "model-00002-of-00002.safetensors)");
  const auto single = torch::randn({7});
  write_file((tmp / "model.safetensors").string(), {{"x", single}});
  for (const bool stale : {false, true}) {
    if (stale) fs::remove(tmp / "model-00002-of-00002.safetensors");
    const auto w = open_hf_weights(dir);
    ASSERT_EQ(w.tensors.size(), 1u) << stale;
    EXPECT_TRUE(torch::equal(w.files[0].read(*w.tensors.at("x").entry), single));
    EXPECT_EQ(w.index, "");
    EXPECT_EQ(w.unread_index, (tmp / "model.safetensors.index.json").string());
    EXPECT_NE(hf_files_read(w).find("model.safetensors (" + w.unread_index +
                                    " and its shards beside it not read"),
              std::string::npos)
        << hf_files_read(w);
    EXPECT_EQ(hf_weight_files(dir), std::vector<std::string>{(tmp / "model.safetensors").string()});
  }
}

}  // namespace
}  // namespace trainer::checkpoint
