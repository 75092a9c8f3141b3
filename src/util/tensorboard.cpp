#include "util/tensorboard.h"

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "util/net/net.h"

namespace trainer::tensorboard {
namespace {

// Byte-wise table for the reflected Castagnoli polynomial 0x82F63B78.
constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr auto kCrcTable = make_table();

// Protocol-buffer wire encoding of the few field kinds an Event needs.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}
template <class T>
void put_fixed(std::string& out, T v) {  // little-endian, as the wire format wants
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, /*wire_type=*/2);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event fields: wall_time = 1 (double), step = 2 (int64), file_version = 3, summary = 5.
std::string event_head(double wall_time) {
  std::string e;
  put_tag(e, 1, /*wire_type=*/1);
  put_fixed(e, wall_time);
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = kCrcTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time) {
  // Summary.Value: tag = 1 (string), simple_value = 2 (float).
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_tag(summary_value, 2, /*wire_type=*/5);
  put_fixed(summary_value, value);
  std::string summary;  // Summary: value = 1 (repeated)
  put_bytes(summary, 1, summary_value);
  std::string e = event_head(wall_time);
  put_tag(e, 2, /*wire_type=*/0);
  put_varint(e, static_cast<uint64_t>(step));
  put_bytes(e, 5, summary);
  return e;
}

std::string version_event(double wall_time) {
  std::string e = event_head(wall_time);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string frame(const std::string& payload) {
  std::string out;
  const uint64_t length = payload.size();
  put_fixed(out, length);
  put_fixed(out, masked_crc32c(out.data(), sizeof(length)));
  out += payload;
  put_fixed(out, masked_crc32c(payload.data(), payload.size()));
  return out;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error(dir + ": cannot create directory: " + ec.message());
  const auto now = std::chrono::system_clock::now();
  const double wall = std::chrono::duration<double>(now.time_since_epoch()).count();
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(static_cast<int64_t>(wall)) + "." +
            host_name("localhost")))
              .string();
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_)
    throw std::runtime_error(path_ + ": cannot open for writing: " + std::strerror(errno));
  write_record(version_event(wall));
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  write_record(scalar_event(tag, static_cast<float>(value), step, wall_time));
}

void EventWriter::write_record(const std::string& payload) {
  const std::string record = frame(payload);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    throw std::runtime_error(path_ + ": write failed: " + std::strerror(errno));
  }
}

}  // namespace trainer::tensorboard
