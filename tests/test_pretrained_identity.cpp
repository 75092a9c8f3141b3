// A base's identity by its contents (checkpoint/pretrained_identity.h): the files loading reads,
// never their path. Folders are written as save_pretrained writes them
// (checkpoint::write_hf_weights).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_folder.h"
#include "checkpoint/pretrained_identity.h"
#include "temp_dir.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using test_support::TempDir;

// Two tensors of 4 KB each from `seed`: one file, or two shards and their index at a 5 KB limit.
checkpoint::NamedTensors weights(int seed) {
  torch::manual_seed(seed);
  return {{"a.weight", torch::randn({32, 32})}, {"b.weight", torch::randn({32, 32})}};
}

void write_folder(const fs::path& dir, int seed, uint64_t max_shard_bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "llama"})";
  checkpoint::write_hf_weights(dir.string(), weights(seed), max_shard_bytes);
}

std::vector<uint8_t> bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(PretrainedIdentity, ACopyAtAnotherPathIsTheSameBase) {
  TempDir tmp("identity_copy");
  write_folder(tmp.path() / "base", 1, 5000);
  ASSERT_TRUE(fs::exists(tmp.path() / "base" / "model.safetensors.index.json"));
  fs::create_directories(tmp.path() / "else");
  fs::copy(tmp.path() / "base", tmp.path() / "else" / "copy", fs::copy_options::recursive);
  EXPECT_EQ(checkpoint::pretrained_identity((tmp.path() / "base").string()),
            checkpoint::pretrained_identity((tmp.path() / "else" / "copy").string()));
  // A weights file under another name and path.
  const auto file = tmp.path() / "base" / "model-00001-of-00002.safetensors";
  fs::copy_file(file, tmp.path() / "else" / "renamed.safetensors");
  EXPECT_EQ(
      checkpoint::pretrained_identity(file.string()),
      checkpoint::pretrained_identity((tmp.path() / "else" / "renamed.safetensors").string()));
  // Other weights in the same layout are another base.
  write_folder(tmp.path() / "other", 2, 5000);
  EXPECT_NE(checkpoint::pretrained_identity((tmp.path() / "base").string()),
            checkpoint::pretrained_identity((tmp.path() / "other").string()));
}

TEST(PretrainedIdentity, HashesExactlyTheFilesLoadingReads) {
  TempDir tmp("identity_files");
  const auto dir = tmp.path() / "base";
  write_folder(dir, 1, 5000);
  const std::string before = checkpoint::pretrained_identity(dir.string());
  // A .safetensors the index does not list is not read by loading.
  fs::copy_file(dir / "model-00001-of-00002.safetensors", dir / "extra.safetensors");
  std::ofstream(dir / "README.md") << "notes";
  EXPECT_EQ(checkpoint::pretrained_identity(dir.string()), before);
  // The files of pretrained_identity_files are those open_hf_weights reads, with config.json.
  auto read = checkpoint::open_hf_weights(dir.string());
  std::vector<std::string> want = {(dir / "config.json").string(), read.index};
  for (const auto& f : read.files) want.push_back(f.path());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(checkpoint::pretrained_identity_files(dir.string()), want);
  // model.safetensors beside the index is read first (transformers' precedence): the index and
  // its shards are then not part of the identity, whatever they hold.
  TempDir single("identity_single");
  write_folder(single.path(), 3, uint64_t{1} << 30);
  const std::string alone = checkpoint::pretrained_identity(single.path().string());
  fs::copy_file(dir / "model.safetensors.index.json",
                single.path() / "model.safetensors.index.json");
  fs::copy_file(dir / "model-00001-of-00002.safetensors",
                single.path() / "model-00001-of-00002.safetensors");
  EXPECT_EQ(checkpoint::pretrained_identity(single.path().string()), alone);
  // A listed shard that changes changes the identity.
  auto shard = bytes_of(dir / "model-00002-of-00002.safetensors");
  shard.back() ^= 1;
  std::ofstream(dir / "model-00002-of-00002.safetensors", std::ios::binary)
      .write(reinterpret_cast<const char*>(shard.data()),
             static_cast<std::streamsize>(shard.size()));
  EXPECT_NE(checkpoint::pretrained_identity(dir.string()), before);
}

TEST(PretrainedIdentity, AcceptsTheIdentityOfAFileWithItsName) {
  TempDir tmp("identity_legacy");
  const auto file = tmp.path() / "base.safetensors";
  write_folder(tmp.path() / "f", 1, uint64_t{1} << 30);
  fs::copy_file(tmp.path() / "f" / "model.safetensors", file);
  // What checkpoints recorded while a weights file's name was hashed: "NAME:SIZE\0" and its bytes
  // (a file this small is hashed whole).
  const auto bytes = bytes_of(file);
  const std::string label = "base.safetensors:" + std::to_string(bytes.size());
  std::vector<uint8_t> hashed(label.begin(), label.end());
  hashed.push_back(0);
  hashed.insert(hashed.end(), bytes.begin(), bytes.end());
  const std::string legacy = checkpoint::xxh64_hex(hashed);
  EXPECT_NE(checkpoint::pretrained_identity(file.string()), legacy);
  EXPECT_TRUE(checkpoint::is_pretrained_identity(file.string(), legacy));
  EXPECT_TRUE(checkpoint::is_pretrained_identity(file.string(),
                                                 checkpoint::pretrained_identity(file.string())));
  EXPECT_FALSE(checkpoint::is_pretrained_identity(file.string(), "0123456789abcdef"));
}

}  // namespace
}  // namespace trainer
