// TensorBoard event files: TFRecord framing around `Event` protos carrying scalar summaries.
//
// Each record is: uint64 length (little-endian), uint32 masked CRC32C of the length bytes, the
// serialised Event, uint32 masked CRC32C of it. Records are flushed as they are written, so a
// live TensorBoard follows the run and a crash leaves every complete record readable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace trainer::tensorboard {

// CRC-32C (Castagnoli), as TFRecord uses it.
uint32_t crc32c(const void* data, size_t size);

// The TFRecord mask over a CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

// A serialised Event{wall_time, step, summary{value{tag, simple_value}}}.
std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time);

// A serialised Event{wall_time, file_version: "brain.Event:2"}, the first record of a file.
std::string version_event(double wall_time);

// `payload` with its TFRecord framing.
std::string frame(const std::string& payload);

class EventWriter {
 public:
  // Creates `dir` if needed and the file <dir>/events.out.tfevents.<unix seconds>.<host>.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // Appends one scalar and flushes it to the file.
  void scalar(const std::string& tag, double value, int64_t step, double wall_time);

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace trainer::tensorboard
