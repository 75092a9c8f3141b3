#include "checkpoint/safetensors.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <set>

#include "util/fileio.h"

namespace trainer::checkpoint {
namespace {

struct DtypeName {
  torch::ScalarType type;
  const char* name;
};

const DtypeName kDtypes[] = {
    {torch::kFloat32, "F32"},   {torch::kFloat64, "F64"}, {torch::kFloat16, "F16"},
    {torch::kBFloat16, "BF16"}, {torch::kInt64, "I64"},   {torch::kInt32, "I32"},
    {torch::kInt16, "I16"},     {torch::kInt8, "I8"},     {torch::kUInt8, "U8"},
    {torch::kBool, "BOOL"},
};

const char* dtype_name(torch::ScalarType t, const std::string& tensor) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw std::invalid_argument("safetensors: tensor '" + tensor + "' has unsupported dtype " +
                              std::string(c10::toString(t)));
}

// The header is padded with spaces to a multiple of this, so the data starts aligned.
constexpr size_t kAlign = 8;
// Headers above this size are treated as corrupt (safetensors' own limit is 100 MB).
constexpr uint64_t kMaxHeader = 100u << 20;

}  // namespace

NamedTensors with_prefix(const NamedTensors& tensors, const std::string& prefix) {
  NamedTensors out;
  for (const auto& [name, tensor] : tensors) {
    if (name.compare(0, prefix.size(), prefix) == 0) {
      out.emplace_back(name.substr(prefix.size()), tensor);
    }
  }
  return out;
}

void write_safetensors(const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(const void*, size_t)>& sink) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> cpu;
  cpu.reserve(tensors.size());
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (!names.insert(name).second) {
      throw std::invalid_argument("safetensors: duplicate tensor name '" + name + "'");
    }
    auto t = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", dtype_name(t.scalar_type(), name)},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    cpu.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((kAlign - text.size() % kAlign) % kAlign, ' ');
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));
  sink(length, sizeof length);
  sink(text.data(), text.size());
  for (const auto& t : cpu) {
    if (t.numel() > 0) sink(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  }
}

SafetensorsFile parse_safetensors(const std::vector<uint8_t>& bytes, const std::string& name) {
  auto fail = [&](const std::string& why) -> FormatError {
    return FormatError(name + ": not a valid safetensors file: " + why);
  };
  if (bytes.size() < 8) throw fail("only " + std::to_string(bytes.size()) + " bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<size_t>(i)];
  if (n > kMaxHeader || n > bytes.size() - 8) {
    throw fail("header length " + std::to_string(n) + " does not fit in " +
               std::to_string(bytes.size()) + " bytes (truncated?)");
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail("header is not a JSON object");
  const uint64_t data_size = bytes.size() - 8 - n;
  const uint8_t* data = bytes.data() + 8 + n;
  SafetensorsFile out;
  // Tensors in file order: sorted by their start offset.
  std::vector<std::pair<uint64_t, std::string>> order;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) throw fail("__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) throw fail("__metadata__ value '" + m.key() + "' is not a string");
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets")) {
      throw fail("entry '" + it.key() + "' lacks dtype, shape or data_offsets");
    }
    order.emplace_back(e["data_offsets"].at(0).get<uint64_t>(), it.key());
  }
  std::sort(order.begin(), order.end());
  uint64_t expected = 0;
  for (const auto& [begin, key] : order) {
    const auto& e = header[key];
    const std::string dtype = e["dtype"].get<std::string>();
    const DtypeName* d = nullptr;
    for (const auto& c : kDtypes)
      if (dtype == c.name) d = &c;
    if (!d) throw fail("tensor '" + key + "' has unsupported dtype " + dtype);
    const auto shape = e["shape"].get<std::vector<int64_t>>();
    const uint64_t end = e["data_offsets"].at(1).get<uint64_t>();
    int64_t numel = 1;
    for (int64_t s : shape) {
      if (s < 0) throw fail("tensor '" + key + "' has a negative size");
      numel *= s;
    }
    const uint64_t want = static_cast<uint64_t>(numel) * c10::elementSize(d->type);
    if (begin != expected || end < begin || end - begin != want) {
      throw fail("tensor '" + key + "' has byte range [" + std::to_string(begin) + ", " +
                 std::to_string(end) + "), expected " + std::to_string(want) + " bytes from " +
                 std::to_string(expected));
    }
    if (end > data_size) {
      throw fail("tensor '" + key + "' ends at byte " + std::to_string(end) + " of a " +
                 std::to_string(data_size) + "-byte data section (truncated?)");
    }
    auto t = torch::empty(shape, torch::TensorOptions().dtype(d->type));
    if (want > 0) std::memcpy(t.data_ptr(), data + begin, want);
    out.tensors.emplace_back(key, std::move(t));
    expected = end;
  }
  if (expected != data_size) {
    throw fail(std::to_string(data_size - expected) + " bytes after the last tensor");
  }
  return out;
}

SafetensorsFile read_safetensors(const std::string& path) {
  try {
    return parse_safetensors(read_bytes(path), path);
  } catch (const IoError& e) {
    throw FormatError(e.what());
  }
}

}  // namespace trainer::checkpoint
