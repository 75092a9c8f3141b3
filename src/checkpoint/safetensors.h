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

}  // namespace trainer::checkpoint
