// TensorBoard event files: CRC32C, the Event encoding and the TFRecord framing read back.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "util/tensorboard.h"

namespace trainer::tensorboard {
namespace {

namespace fs = std::filesystem;

// The payloads of the complete, checksum-valid records at the start of `bytes`.
std::vector<std::string> read_records(const std::string& bytes) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos + 12 <= bytes.size()) {
    uint64_t length;
    uint32_t length_crc, data_crc;
    std::memcpy(&length, bytes.data() + pos, 8);
    std::memcpy(&length_crc, bytes.data() + pos + 8, 4);
    if (length_crc != masked_crc32c(bytes.data() + pos, 8)) break;
    if (pos + 12 + length + 4 > bytes.size()) break;
    const std::string payload = bytes.substr(pos + 12, length);
    std::memcpy(&data_crc, bytes.data() + pos + 12 + length, 4);
    if (data_crc != masked_crc32c(payload.data(), payload.size())) break;
    out.push_back(payload);
    pos += 12 + length + 4;
  }
  return out;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TensorBoard, Crc32cCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the standard CRC-32C check value
  EXPECT_EQ(crc32c("", 0), 0u);
  EXPECT_EQ(masked_crc32c("", 0), 0xa282ead8u);  // rotate(0) + delta
}

TEST(TensorBoard, ScalarEventEncoding) {
  const std::string e = scalar_event("a", /*value=*/1.0f, /*step=*/3, /*wall_time=*/0.0);
  const std::vector<uint8_t> want = {
      0x09, 0,    0,    0,    0,    0, 0, 0, 0,  // wall_time = 0.0 (field 1, fixed64)
      0x10, 0x03,                                // step = 3 (field 2, varint)
      0x2A, 0x0A,                                // summary (field 5), 10 bytes
      0x0A, 0x08,                                //   value (field 1), 8 bytes
      0x0A, 0x01, 'a',                           //     tag = "a"
      0x15, 0x00, 0x00, 0x80, 0x3F,              //     simple_value = 1.0f (field 2, fixed32)
  };
  EXPECT_EQ(std::vector<uint8_t>(e.begin(), e.end()), want);
}

TEST(TensorBoard, LargeStepsUseMultiByteVarints) {
  const std::string e = scalar_event("t", 0.0f, /*step=*/300, /*wall_time=*/0.0);
  EXPECT_EQ(static_cast<uint8_t>(e[9]), 0x10);
  EXPECT_EQ(static_cast<uint8_t>(e[10]), 0xAC);  // 300 = 0b10'0101100
  EXPECT_EQ(static_cast<uint8_t>(e[11]), 0x02);
}

TEST(TensorBoard, WriterFramesEveryRecord) {
  test_support::TempDir tmp("tb");
  std::string path;
  {
    EventWriter w((tmp / "tb").string());
    path = w.path();
    w.scalar("train/loss", 0.5, /*step=*/1, /*wall_time=*/100.0);
    w.scalar("lr", 0.1, /*step=*/1, /*wall_time=*/100.0);
  }
  EXPECT_EQ(fs::path(path).parent_path(), tmp / "tb");
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  const auto records = read_records(read_file(path));
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  EXPECT_EQ(records[1], scalar_event("train/loss", 0.5f, 1, 100.0));
  EXPECT_EQ(records[2], scalar_event("lr", 0.1f, 1, 100.0));
}

TEST(TensorBoard, RecordsAreOnDiskBeforeTheWriterCloses) {
  test_support::TempDir tmp("tb");
  EventWriter w(tmp.path().string());
  w.scalar("val/top1", 0.9, /*step=*/5, /*wall_time=*/1.0);
  // Still open: a crash now would leave both records readable.
  EXPECT_EQ(read_records(read_file(w.path())).size(), 2u);
}

TEST(TensorBoard, TruncatedFileKeepsItsCompleteRecords) {
  const std::string bytes = frame(version_event(1.0)) + frame(scalar_event("a", 1.0f, 1, 1.0)) +
                            frame(scalar_event("a", 2.0f, 2, 2.0));
  for (size_t cut = 1; cut < 20; ++cut) {
    EXPECT_EQ(read_records(bytes.substr(0, bytes.size() - cut)).size(), 2u) << cut;
  }
}

TEST(TensorBoard, UnwritableDirectoryIsAClearError) {
  try {
    EventWriter w("/proc/no/such/dir");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/no/such/dir"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trainer::tensorboard
