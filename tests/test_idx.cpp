// The IDX reader on hand-built files: raw and gzip, good and damaged.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/image/idx.h"
#include "idx_files.h"
#include "temp_dir.h"

namespace trainer::data {
namespace {

namespace fs = std::filesystem;

using test_support::idx_bytes;

std::vector<uint8_t> iota_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

class IdxTest : public ::testing::Test {
 protected:
  std::string write_raw(const std::string& name, const std::vector<uint8_t>& bytes) {
    test_support::write_bytes(dir_ / name, bytes, /*gzip=*/false);
    return (dir_ / name).string();
  }

  std::string write_gzip(const std::string& name, const std::vector<uint8_t>& bytes) {
    test_support::write_bytes(dir_ / name, bytes, /*gzip=*/true);
    return (dir_ / name).string();
  }

  // Expects read_idx(path) to throw IdxError whose message starts with the path and contains
  // `substring`.
  void expect_error(const std::string& path, const std::string& substring) {
    try {
      read_idx(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const IdxError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
      EXPECT_NE(msg.find(substring), std::string::npos) << msg;
    }
  }

  test_support::TempDir tmp_{"idx"};
  const fs::path& dir_ = tmp_.path();
};

TEST_F(IdxTest, ReadsRawUnsignedBytes) {
  const auto payload = iota_bytes(2 * 3 * 4);
  const auto path = write_raw("images.idx", idx_bytes(0x08, {2, 3, 4}, payload));
  const IdxArray a = read_idx(path);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(a.type, IdxType::kUInt8);
  EXPECT_EQ(a.numel(), 24);
  EXPECT_EQ(a.data, payload);
}

TEST_F(IdxTest, ReadsGzipDetectedByMagicNotName) {
  const auto payload = iota_bytes(10);
  // A gzip file without .gz and a raw file with .gz.
  const auto gz_path = write_gzip("labels", idx_bytes(0x08, {10}, payload));
  const auto raw_path = write_raw("labels.gz", idx_bytes(0x08, {10}, payload));
  for (const auto& path : {gz_path, raw_path}) {
    const IdxArray a = read_idx(path);
    EXPECT_EQ(a.dims, (std::vector<int64_t>{10}));
    EXPECT_EQ(a.data, payload);
  }
}

TEST_F(IdxTest, ElementSizesOfAllTypes) {
  const std::vector<std::pair<uint8_t, int64_t>> types = {{0x08, 1}, {0x09, 1}, {0x0B, 2},
                                                          {0x0C, 4}, {0x0D, 4}, {0x0E, 8}};
  for (const auto& [code, size] : types) {
    const auto payload = iota_bytes(static_cast<size_t>(3 * 2 * size));
    const auto path = write_gzip("t" + std::to_string(code), idx_bytes(code, {3, 2}, payload));
    const IdxArray a = read_idx(path);
    EXPECT_EQ(static_cast<int>(a.type), code);
    EXPECT_EQ(idx_element_size(a.type), size);
    EXPECT_EQ(a.data, payload);
  }
}

TEST_F(IdxTest, FourDimensions) {
  const auto payload = iota_bytes(2 * 1 * 3 * 2);
  const IdxArray a = read_idx(write_raw("four", idx_bytes(0x08, {2, 1, 3, 2}, payload)));
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 1, 3, 2}));
}

TEST_F(IdxTest, TruncatedData) {
  auto bytes = idx_bytes(0x08, {4, 5}, iota_bytes(20));
  bytes.resize(bytes.size() - 3);
  expect_error(write_raw("cut", bytes), "truncated: expected 20 bytes of data, found 17");
  expect_error(write_gzip("cut.gz", bytes), "truncated: expected 20 bytes of data, found 17");
}

TEST_F(IdxTest, TruncatedHeader) {
  auto bytes = idx_bytes(0x08, {4, 5}, iota_bytes(20));
  bytes.resize(9);  // inside the second dimension size
  expect_error(write_raw("header", bytes), "truncated");
  expect_error(write_raw("tiny", {0, 0}), "truncated");
  expect_error(write_raw("empty", {}), "truncated");
  expect_error(write_gzip("empty.gz", {}), "truncated");
}

TEST_F(IdxTest, TrailingBytes) {
  auto bytes = idx_bytes(0x08, {4}, iota_bytes(4));
  bytes.push_back(0);
  expect_error(write_raw("trail", bytes), "trailing");
  expect_error(write_gzip("trail.gz", bytes), "expected 4 bytes of data, found 5");
}

TEST_F(IdxTest, BadMagic) {
  expect_error(write_raw("magic", {1, 0, 8, 1, 0, 0, 0, 0}), "bad magic");
  expect_error(write_raw("text", {'h', 'e', 'l', 'l', 'o'}), "bad magic");
}

TEST_F(IdxTest, BadTypeCode) {
  expect_error(write_raw("type", idx_bytes(0x0A, {1}, {0})), "type code 0x0a");
  expect_error(write_raw("type2", idx_bytes(0x07, {1}, {0})), "type code");
}

TEST_F(IdxTest, BadNumberOfDimensions) {
  expect_error(write_raw("zero", {0, 0, 8, 0}), "number of dimensions 0");
  expect_error(write_raw("five", idx_bytes(0x08, {1, 1, 1, 1, 1}, {0})), "number of dimensions 5");
}

TEST_F(IdxTest, CorruptGzip) {
  // A valid gzip header (magic, deflate, no flags, mtime, xfl, os) then garbage.
  std::vector<uint8_t> bytes = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
  for (int i = 0; i < 64; ++i) bytes.push_back(static_cast<uint8_t>(0xff - i * 3));
  expect_error(write_raw("corrupt.gz", bytes), "corrupt gzip");
}

TEST_F(IdxTest, CutGzipStream) {
  const auto good = idx_bytes(0x08, {100, 10}, iota_bytes(1000));
  const auto path = write_gzip("good.gz", good);
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  gz.resize(gz.size() / 2);
  try {
    read_idx(write_raw("half.gz", gz));
    ADD_FAILURE() << "no error for a cut gzip stream";
  } catch (const IdxError& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("corrupt gzip") != std::string::npos ||
                msg.find("truncated") != std::string::npos)
        << msg;
  }
}

TEST_F(IdxTest, MissingFile) {
  expect_error((dir_ / "absent").string(), "cannot open");
}

}  // namespace
}  // namespace trainer::data
