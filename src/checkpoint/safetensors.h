// The safetensors format (huggingface/safetensors): an 8-byte little-endian header length, a JSON
// header mapping each tensor name to its dtype, shape and byte range, then the raw little-endian
// tensor bytes. Python reads these files with safetensors.torch.load_file.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace trainer::checkpoint {

// Unreadable, truncated or malformed files; the message names the file and the problem.
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// The tensors whose names start with `prefix`, with the prefix removed ("model.fc.weight" ->
// "fc.weight" for prefix "model.").
NamedTensors with_prefix(const NamedTensors& tensors, const std::string& prefix);

// The bytes of a safetensors file holding `tensors` (in this order; names unique) and the
// string-to-string `metadata` (the header's "__metadata__"), passed to `sink` in pieces.
// Tensors may live on any device and have any strides.
void write_safetensors(const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(const void*, size_t)>& sink);

struct SafetensorsFile {
  NamedTensors tensors;  // in the file's order, on the CPU
  std::map<std::string, std::string> metadata;
};

// Parses a whole file held in memory; `name` appears in error messages.
SafetensorsFile parse_safetensors(const std::vector<uint8_t>& bytes, const std::string& name);

// Reads and parses `path`; FormatError naming it when it cannot be read or parsed.
SafetensorsFile read_safetensors(const std::string& path);

// One tensor as a file's header describes it.
struct SafetensorsEntry {
  std::string name;
  torch::ScalarType dtype = torch::kFloat;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // the tensor's first byte in the file
  uint64_t bytes = 0;   // its size in the file
};

// A safetensors file read tensor by tensor: opening reads and checks its header (every tensor's
// dtype, shape and byte range, the ranges back to back and ending at the end of the file, so a
// truncated file fails here), and each read copies one tensor's bytes from the file into memory
// the caller holds, never the whole file. The file stays open until the reader is destroyed.
class SafetensorsReader {
 public:
  // Throws FormatError naming `path` when it cannot be opened or its header is malformed.
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  // The tensors in file order.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  // The entry named `name`, or null.
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads `entry` (one of entries()) into `dst`, a tensor on the CPU with the entry's element
  // count, of any dtype and strides: the file's values converted to dst's dtype as
  // Tensor::copy_ converts, `chunk_bytes` of the file at a time (no copy at all for a contiguous
  // dst of the file's dtype). Throws FormatError naming the file when a read fails (a file that
  // shrank or an I/O error).
  void read_into(const SafetensorsEntry& entry, const torch::Tensor& dst,
                 size_t chunk_bytes = size_t{64} << 20) const;
  // Reads elements [first, first + dst.numel()) of `entry` flattened (row-major, as the file
  // holds them) into `dst`, a contiguous tensor on the CPU, converted to its dtype as read_into
  // converts: the part of a tensor that one rank keeps. Throws std::invalid_argument when the
  // range passes the tensor's end, FormatError as read_into.
  void read_range_into(const SafetensorsEntry& entry, int64_t first, const torch::Tensor& dst,
                       size_t chunk_bytes = size_t{64} << 20) const;
  // The tensor `entry` in the file's dtype, on the CPU.
  torch::Tensor read(const SafetensorsEntry& entry) const;

 private:
  void read_bytes_at(uint64_t offset, void* out, size_t n) const;

  std::string path_;
  int fd_ = -1;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;  // name -> position in entries_
  std::map<std::string, std::string> metadata_;
};

}  // namespace trainer::checkpoint
