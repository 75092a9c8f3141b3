// The tokens dataset: byte-level text, uint16 and uint32 token files.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "config/config.h"
#include "data/dataset.h"
#include "temp_dir.h"

namespace trainer::data {
namespace {

namespace fs = std::filesystem;

class TokensTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    const fs::path p = tmp_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
  std::string write_u16(const std::string& name, const std::vector<uint16_t>& tokens) {
    std::string bytes;
    for (uint16_t t : tokens) {
      bytes.push_back(static_cast<char>(t & 0xFF));  // little-endian
      bytes.push_back(static_cast<char>(t >> 8));
    }
    return write(name, bytes);
  }
  config::DataConfig config(const std::string& root, int64_t seq_len) const {
    config::DataConfig cfg = default_data_config();
    cfg.name = "tokens";
    cfg.root = root;
    cfg.options.set("seq_len", seq_len);
    cfg.options.set("val_fraction", 0.25);
    return cfg;
  }
  Splits make(const config::DataConfig& cfg) const {
    return dataset_registry().get("tokens")(cfg, DataContext{/*seed=*/0});
  }
  test_support::TempDir tmp_{"tokens"};
};

std::vector<int64_t> row(const torch::Tensor& t) {
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

TEST_F(TokensTest, TextFileAsBytesWithTailValidation) {
  std::string text;
  for (int i = 0; i < 40; ++i) text.push_back(static_cast<char>('a' + i % 26));
  const Splits s = make(config(write("corpus.txt", text), /*seq_len=*/4));
  EXPECT_TRUE(s.spec.sequence);
  EXPECT_EQ(s.spec.num_classes, 256);
  EXPECT_EQ(s.spec.sample_shape, (std::vector<int64_t>{4}));
  // 30 training bytes -> (30 - 1) / 4 = 7 windows; 10 validation bytes -> 2.
  EXPECT_EQ(s.train->size(), 7);
  EXPECT_EQ(s.val->size(), 2);
  // Validation windows tile the last 10 bytes in order; targets are inputs shifted by one.
  const Batch v = s.val->get({0, 1});
  EXPECT_EQ(v.inputs.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(v.inputs.dtype(), torch::kInt64);
  EXPECT_EQ(row(v.inputs[0]), (std::vector<int64_t>{text[30], text[31], text[32], text[33]}));
  EXPECT_EQ(row(v.targets[0]), (std::vector<int64_t>{text[31], text[32], text[33], text[34]}));
  EXPECT_EQ(row(v.inputs[1]), (std::vector<int64_t>{text[34], text[35], text[36], text[37]}));
}

TEST_F(TokensTest, TrainingWindowsAreRandomReproducibleAndInside) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>(i % 251));
  const Splits s = make(config(write("corpus.txt", text), /*seq_len=*/8));
  std::vector<int64_t> all(static_cast<size_t>(s.train->size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  const Epoch e0{1, 0}, e1{1, 1};
  const Batch a = s.train->get(all, e0);
  EXPECT_TRUE(torch::equal(a.inputs, s.train->get(all, e0).inputs));
  EXPECT_FALSE(torch::equal(a.inputs, s.train->get(all, e1).inputs));
  EXPECT_TRUE(torch::equal(a.inputs[5], s.train->get({5}, e0).inputs[0]));
  std::set<int64_t> starts;
  for (int64_t i = 0; i < a.inputs.size(0); ++i) {
    const auto in = row(a.inputs[i]), out = row(a.targets[i]);
    // Byte k of the corpus is k % 251, so a window is consecutive and within the 750 training
    // bytes.
    const int64_t start = in[0];
    for (int64_t j = 0; j < 8; ++j) {
      EXPECT_EQ(in[static_cast<size_t>(j)], (start + j) % 251);
      EXPECT_EQ(out[static_cast<size_t>(j)], (start + j + 1) % 251);
    }
    starts.insert(start);
  }
  EXPECT_GT(starts.size(), 50u);
}

TEST_F(TokensTest, Uint16FolderLayout) {
  fs::create_directories(tmp_ / "owt");
  std::vector<uint16_t> train, val;
  for (uint16_t i = 0; i < 100; ++i) train.push_back(static_cast<uint16_t>(1000 + i * 300));
  for (uint16_t i = 0; i < 20; ++i) val.push_back(static_cast<uint16_t>(50000 + i));
  write_u16("owt/train.bin", train);
  write_u16("owt/val.bin", val);
  const Splits s = make(config((tmp_ / "owt").string(), /*seq_len=*/5));
  EXPECT_EQ(s.spec.num_classes, 50020);  // the largest id + 1
  EXPECT_EQ(s.train->size(), 19);
  EXPECT_EQ(s.val->size(), 3);
  const Batch v = s.val->get({1});
  EXPECT_EQ(row(v.inputs[0]), (std::vector<int64_t>{50005, 50006, 50007, 50008, 50009}));
  EXPECT_EQ(row(v.targets[0]), (std::vector<int64_t>{50006, 50007, 50008, 50009, 50010}));
}

// data.token_format: uint32, for vocabularies past uint16: ids above 65535 read back whole.
TEST_F(TokensTest, Uint32Tokens) {
  std::string bytes;
  for (uint32_t i = 0; i < 40; ++i) {
    const uint32_t t = 70000 + i * 1000;
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>((t >> (8 * b)) & 0xFF));
  }
  auto cfg = config(write("wide.u32", bytes), /*seq_len=*/4);
  cfg.options.set("token_format", std::string("uint32"));
  const Splits s = make(cfg);
  EXPECT_EQ(s.spec.num_classes, 70000 + 39 * 1000 + 1);
  const Batch v = s.val->get({0});  // the last quarter: tokens 30..39
  EXPECT_EQ(row(v.inputs[0]), (std::vector<int64_t>{100000, 101000, 102000, 103000}));
  cfg.root = write("short.u32", bytes.substr(0, 6));
  try {  // 6 bytes: not whole uint32 tokens
    make(cfg);
    ADD_FAILURE() << "no error";
  } catch (const DataConfigError& e) {
    EXPECT_EQ(e.key(), "data.token_format");
    EXPECT_NE(e.message().find(cfg.root + ": 6 bytes"), std::string::npos) << e.message();
  }
}

// Little-endian uint32 bytes of `ids`.
std::string u32_bytes(const std::vector<uint32_t>& ids) {
  std::string bytes;
  for (uint32_t t : ids) {
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>((t >> (8 * b)) & 0xFF));
  }
  return bytes;
}

// The description trainer tokenize writes beside a token file, as its documentation spells it.
std::string sidecar_text(const std::string& dtype, int64_t tokens, int64_t vocab) {
  return "{\"format\": \"trainer-tokens\", \"version\": 1, \"dtype\": \"" + dtype +
         "\", \"tokens\": " + std::to_string(tokens) +
         ", \"vocab_size\": " + std::to_string(vocab) +
         ", \"documents\": 1, \"end_of_text\": 151643, \"tokenizer\": {\"path\": "
         "\"/m/tokenizer.json\", \"xxh64\": \"0123456789abcdef\"}}";
}

// Ids of Qwen's vocabulary: some past uint16, the rest below it.
std::vector<uint32_t> wide_ids(int n) {
  std::vector<uint32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<uint32_t>((i * 7919) % 151669));
  return ids;
}

// A .bin file with a uint32 description reads as uint32 at data.token_format: auto (it would be
// uint16 by its suffix), its vocabulary the description's.
TEST_F(TokensTest, SidecarGivesTheWidthAndVocabulary) {
  const auto ids = wide_ids(400);
  const std::string bin = write("wide.bin", u32_bytes(ids));
  write("wide.bin.json", sidecar_text("uint32", 400, 151669));
  const Splits s = make(config(bin, /*seq_len=*/4));
  EXPECT_EQ(s.spec.num_classes, 151669);
  EXPECT_TRUE(s.spec.vocabulary_known);
  EXPECT_EQ(s.val->size(), (100 - 1) / 4);  // the last quarter: ids 300..399
  const Batch v = s.val->get({2});
  EXPECT_EQ(row(v.inputs[0]), (std::vector<int64_t>{ids[308], ids[309], ids[310], ids[311]}));
  EXPECT_EQ(row(v.targets[0]), (std::vector<int64_t>{ids[309], ids[310], ids[311], ids[312]}));
}

// What disagrees with the description is a config error naming the file and the description.
TEST_F(TokensTest, SidecarDisagreementsAreRefused) {
  auto refusal = [&](const config::DataConfig& cfg) -> std::pair<std::string, std::string> {
    try {
      make(cfg);
    } catch (const DataConfigError& e) {
      return {e.key(), e.message()};
    }
    return {"", "no error"};
  };
  const auto ids = wide_ids(400);
  const std::string bin = write("w.bin", u32_bytes(ids));
  const std::string side = write("w.bin.json", sidecar_text("uint32", 400, 151669));
  auto cfg = config(bin, 4);
  cfg.options.set("token_format", std::string("uint16"));
  auto [key, message] = refusal(cfg);
  EXPECT_EQ(key, "data.token_format");
  EXPECT_NE(message.find(side), std::string::npos) << message;
  EXPECT_NE(message.find(bin + " holds uint32"), std::string::npos) << message;
  cfg.options.set("token_format", std::string("uint32"));
  EXPECT_EQ(make(cfg).spec.num_classes, 151669);  // agreeing: read

  const std::string cut = write("cut.bin", u32_bytes(ids).substr(0, 399 * 4));
  write("cut.bin.json", sidecar_text("uint32", 400, 151669));
  std::tie(key, message) = refusal(config(cut, 4));
  EXPECT_EQ(key, "data.root");
  EXPECT_NE(message.find(cut + ": 1596 bytes, but " + cut + ".json says it holds 400 uint32"),
            std::string::npos)
      << message;

  const std::string small = write("small.bin", u32_bytes(ids));
  write("small.bin.json", sidecar_text("uint32", 400, 1000));
  std::tie(key, message) = refusal(config(small, 4));
  EXPECT_EQ(key, "data.root");
  EXPECT_NE(message.find("past the vocabulary of 1000 tokens that " + small + ".json"),
            std::string::npos)
      << message;

  const std::string junk = write("junk.bin", u32_bytes(ids));
  write("junk.bin.json", "{\"format\": \"trainer-tokens\", \"version\": 1, \"dtype\": \"int8\"}");
  std::tie(key, message) = refusal(config(junk, 4));
  EXPECT_EQ(key, "data.root");
  EXPECT_NE(message.find(junk + ".json: \"dtype\" must be"), std::string::npos) << message;
}

// train.bin described as uint32 and val.bin without a description (read as uint16 by its suffix)
// are refused together; a uint32 .bin without a description is not read as uint16.
TEST_F(TokensTest, UndescribedFilesThatCannotBeUint16AreRefused) {
  fs::create_directories(tmp_ / "mixed");
  const auto ids = wide_ids(400);
  write("mixed/train.bin", u32_bytes(ids));
  write("mixed/train.bin.json", sidecar_text("uint32", 400, 151669));
  write("mixed/val.bin", u32_bytes(wide_ids(100)));  // under 256 tokens: not recognisable alone
  try {
    make(config((tmp_ / "mixed").string(), 4));
    ADD_FAILURE() << "no error";
  } catch (const DataConfigError& e) {
    EXPECT_EQ(e.key(), "data.root");
    EXPECT_NE(e.message().find("train.bin (uint32, described by "), std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find("val.bin (uint16)"), std::string::npos) << e.message();
  }
  const std::string bare = write("bare.bin", u32_bytes(ids));
  try {
    make(config(bare, 4));
    ADD_FAILURE() << "no error";
  } catch (const DataConfigError& e) {
    EXPECT_EQ(e.key(), "data.token_format");
    EXPECT_NE(e.message().find(bare + ": auto reads a .bin file as uint16"), std::string::npos)
        << e.message();
  }
  auto cfg = config(bare, 4);
  cfg.options.set("token_format", std::string("uint16"));
  EXPECT_EQ(make(cfg).train->size(), (600 - 1) / 4);  // set explicitly: 800 uint16, 600 train
}

TEST_F(TokensTest, BadFilesAreClearErrors) {
  auto message = [&](const config::DataConfig& cfg) -> std::string {
    try {
      make(cfg);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string odd = write("odd.bin", "abc");
  EXPECT_NE(message(config(odd, 2)).find(odd + ": 3 bytes is not a whole number of uint16"),
            std::string::npos);
  const std::string tiny = write("tiny.txt", "0123456789");
  EXPECT_NE(message(config(tiny, 4)).find(tiny + ": the validation part"), std::string::npos)
      << message(config(tiny, 4));
  EXPECT_NE(message(config((tmp_ / "absent").string(), 4)).find("no such file or directory"),
            std::string::npos);
  fs::create_directories(tmp_ / "empty");
  EXPECT_NE(message(config((tmp_ / "empty").string(), 4)).find("no train.bin"), std::string::npos);
  try {
    make(config("", 4));
    ADD_FAILURE() << "no error";
  } catch (const DataConfigError& e) {
    EXPECT_EQ(e.key(), "data.root");
  }
}

}  // namespace
}  // namespace trainer::data
