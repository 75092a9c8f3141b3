// A reader of IDX files (the MNIST / Fashion-MNIST format), raw or gzip-compressed. Torch-free.
//
// Layout: two zero bytes, a type code, the number of dimensions n, then n big-endian uint32
// dimension sizes, then the elements in row-major order (multi-byte elements big-endian).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::data {

// Thrown for unreadable, truncated or corrupt IDX files; the message starts with the file path.
class IdxError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// IDX element type codes.
enum class IdxType : uint8_t {
  kUInt8 = 0x08,
  kInt8 = 0x09,
  kInt16 = 0x0B,
  kInt32 = 0x0C,
  kFloat32 = 0x0D,
  kFloat64 = 0x0E,
};

// Bytes per element of `type`.
int64_t idx_element_size(IdxType type);

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
  IdxType type = IdxType::kUInt8;
  // The elements as stored in the file: row-major, multi-byte elements big-endian.
  std::vector<uint8_t> data;

  int64_t numel() const;
};

// Reads the IDX file at `path`. gzip compression is detected by the magic bytes 1f 8b, not by the
// file name. Throws IdxError for a missing, unreadable, truncated, oversized or corrupt file.
IdxArray read_idx(const std::string& path);

// Parses an uncompressed IDX image held in memory; `path` only names it in messages.
IdxArray parse_idx(const std::vector<uint8_t>& bytes, const std::string& path);

}  // namespace trainer::data
