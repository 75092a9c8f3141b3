#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "util/device.h"
#include "util/fileio.h"
#include "util/json_error.h"

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

// Makes the error of a malformed file from what is wrong.
using Fail = std::function<FormatError(const std::string& why)>;

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
    auto t = read_to_host(tensor.detach()).contiguous();
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

namespace {

// One tensor's header entry, checked against the data section it must lie in.
struct TensorEntry {
  std::string key;
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
};

// The header: a JSON object after its 8-byte length.
struct Header {
  nlohmann::json json;
  uint64_t length = 0;  // bytes of JSON; the data section follows them
};

Header parse_header(const std::vector<uint8_t>& bytes, const Fail& fail) {
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
    std::string line, column;
    const std::string why = json_error_text(e, &line, &column);
    throw fail("header is not JSON" +
               (line.empty() ? "" : " at line " + line + ", column " + column) + ": " + why);
  }
  if (!header.is_object()) throw fail("header is not a JSON object");
  return {std::move(header), n};
}

// Entry `key` of the header: its dtype, shape and byte range, each checked for its type.
TensorEntry parse_entry(const std::string& key, const nlohmann::json& e, const Fail& fail) {
  if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
      !e.contains("data_offsets")) {
    throw fail("entry '" + key + "' lacks dtype, shape or data_offsets");
  }
  TensorEntry t;
  t.key = key;
  const auto& dtype = e["dtype"];
  const DtypeName* d = nullptr;
  for (const auto& c : kDtypes)
    if (dtype.is_string() && dtype.get<std::string>() == c.name) d = &c;
  if (!d) throw fail("tensor '" + key + "' has unsupported dtype " + dtype.dump());
  t.dtype = d->type;
  const auto& offsets = e["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    throw fail("tensor '" + key + "' has data_offsets " + offsets.dump() +
               "; expected two byte offsets [begin, end]");
  }
  t.begin = offsets[0].get<uint64_t>();
  t.end = offsets[1].get<uint64_t>();
  const auto& shape = e["shape"];
  if (!shape.is_array()) throw fail("tensor '" + key + "' has shape " + shape.dump());
  for (const auto& s : shape) {
    if (!s.is_number_integer() || s.get<int64_t>() < 0) {
      throw fail("tensor '" + key + "' has shape " + shape.dump() +
                 "; expected non-negative integers");
    }
    t.shape.push_back(s.get<int64_t>());
  }
  return t;
}

// The bytes entry `t` must span, or nullopt when its element count overflows.
std::optional<uint64_t> byte_size(const TensorEntry& t) {
  uint64_t bytes = c10::elementSize(t.dtype);
  for (int64_t s : t.shape) {
    if (s != 0 && bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(s)) {
      return std::nullopt;
    }
    bytes *= static_cast<uint64_t>(s);
  }
  return bytes;
}

}  // namespace

namespace {

// The header of a file of `file_size` bytes whose first bytes are `head`: its metadata and its
// entries in file order, each checked to lie right after the one before, the last ending at the
// end of the file.
struct Layout {
  std::map<std::string, std::string> metadata;
  std::vector<TensorEntry> entries;
  uint64_t data_start = 0;
};

Layout layout_of(const std::vector<uint8_t>& head, uint64_t file_size, const Fail& fail) {
  const Header header = parse_header(head, fail);
  Layout out;
  out.data_start = 8 + header.length;
  for (auto it = header.json.begin(); it != header.json.end(); ++it) {
    if (it.key() != "__metadata__") {
      out.entries.push_back(parse_entry(it.key(), *it, fail));
      continue;
    }
    if (!it->is_object()) throw fail("__metadata__ is not an object");
    for (auto m = it->begin(); m != it->end(); ++m) {
      if (!m->is_string()) throw fail("__metadata__ value '" + m.key() + "' is not a string");
      out.metadata[m.key()] = m->get<std::string>();
    }
  }
  std::sort(out.entries.begin(), out.entries.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.begin < b.begin; });
  const uint64_t data_size = file_size - out.data_start;
  uint64_t expected = 0;
  for (const auto& t : out.entries) {
    const auto want = byte_size(t);
    if (!want || t.begin != expected || t.end < t.begin || t.end - t.begin != *want) {
      throw fail("tensor '" + t.key + "' has byte range [" + std::to_string(t.begin) + ", " +
                 std::to_string(t.end) + "), expected " +
                 (want ? std::to_string(*want) : std::string("an overflowing number of")) +
                 " bytes from " + std::to_string(expected));
    }
    if (t.end > data_size) {
      throw fail("tensor '" + t.key + "' ends at byte " + std::to_string(t.end) + " of a " +
                 std::to_string(data_size) + "-byte data section (truncated?)");
    }
    expected = t.end;
  }
  if (expected != data_size) {
    throw fail(std::to_string(data_size - expected) + " bytes after the last tensor");
  }
  return out;
}

Fail failing_as(const std::string& name) {
  return [name](const std::string& why) {
    return FormatError(name + ": not a valid safetensors file: " + why);
  };
}

}  // namespace

SafetensorsFile parse_safetensors(const std::vector<uint8_t>& bytes, const std::string& name) {
  Layout layout = layout_of(bytes, bytes.size(), failing_as(name));
  SafetensorsFile out;
  out.metadata = std::move(layout.metadata);
  const uint8_t* data = bytes.data() + layout.data_start;
  for (const auto& t : layout.entries) {
    auto tensor = torch::empty(t.shape, torch::TensorOptions().dtype(t.dtype));
    if (t.end > t.begin) std::memcpy(tensor.data_ptr(), data + t.begin, t.end - t.begin);
    out.tensors.emplace_back(t.key, std::move(tensor));
  }
  return out;
}

namespace {

// The first bytes of the `size`-byte file `path`: the length and the header. A file whose size
// its header does not account for is rejected before anything of its size is allocated.
std::vector<uint8_t> read_head(const std::string& path, uint64_t size) {
  std::vector<uint8_t> head = read_prefix(path, 8);
  if (head.size() == 8) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | head[static_cast<size_t>(i)];
    if (n > kMaxHeader || n > size - 8) {
      throw failing_as(path)("header length " + std::to_string(n) + " does not fit in " +
                             std::to_string(size) + " bytes (truncated?)");
    }
    head = read_prefix(path, 8 + n);
  }
  return head;
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  try {
    const uint64_t size = file_size(path);
    layout_of(read_head(path, size), size, failing_as(path));
    return parse_safetensors(read_bytes(path), path);
  } catch (const IoError& e) {
    throw FormatError(e.what());
  }
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  Layout layout;
  try {
    const uint64_t size = file_size(path_);
    layout = layout_of(read_head(path_, size), size, failing_as(path_));
  } catch (const IoError& e) {
    throw FormatError(e.what());
  }
  metadata_ = std::move(layout.metadata);
  for (const auto& t : layout.entries) {
    index_.emplace(t.key, entries_.size());
    entries_.push_back({t.key, t.dtype, t.shape, layout.data_start + t.begin, t.end - t.begin});
  }
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw FormatError(path_ + ": cannot open: " + std::strerror(errno));
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      entries_(std::move(other.entries_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    entries_ = std::move(other.entries_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

void SafetensorsReader::read_bytes_at(uint64_t offset, void* out, size_t n) const {
  auto* bytes = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, bytes + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      throw FormatError(path_ + ": read error at byte " + std::to_string(offset + done) + ": " +
                        (got < 0 ? std::strerror(errno)
                                 : "the file is shorter than its header "
                                   "says (truncated while reading?)"));
    }
    done += static_cast<size_t>(got);
  }
}

void SafetensorsReader::read_into(const SafetensorsEntry& entry, const torch::Tensor& dst,
                                  size_t chunk_bytes) const {
  const size_t element = c10::elementSize(entry.dtype);
  const int64_t count = static_cast<int64_t>(entry.bytes / element);
  if (dst.numel() != count || !dst.device().is_cpu()) {
    throw std::invalid_argument("safetensors: " + entry.name + " read into a tensor of " +
                                std::to_string(dst.numel()) + " elements on " + dst.device().str() +
                                "; expected " + std::to_string(count) + " on the CPU");
  }
  torch::NoGradGuard no_grad;
  if (dst.scalar_type() == entry.dtype && dst.is_contiguous()) {
    read_bytes_at(entry.offset, dst.data_ptr(), entry.bytes);
    return;
  }
  // A contiguous destination is filled chunk by chunk through a flat view; any other through a
  // contiguous copy of the file's values.
  if (!dst.is_contiguous()) {
    dst.copy_(read(entry).view(dst.sizes()));
    return;
  }
  read_range_into(entry, 0, dst, chunk_bytes);
}

void SafetensorsReader::read_range_into(const SafetensorsEntry& entry, int64_t first,
                                        const torch::Tensor& dst, size_t chunk_bytes) const {
  const size_t element = c10::elementSize(entry.dtype);
  const int64_t count = dst.numel();
  if (first < 0 || static_cast<uint64_t>(first + count) * element > entry.bytes ||
      !dst.device().is_cpu() || !dst.is_contiguous()) {
    throw std::invalid_argument("safetensors: elements [" + std::to_string(first) + ", " +
                                std::to_string(first + count) + ") of " + entry.name +
                                " read into a tensor on " + dst.device().str() +
                                "; expected a range of the tensor, contiguous on the CPU");
  }
  torch::NoGradGuard no_grad;
  const uint64_t start_byte = entry.offset + static_cast<uint64_t>(first) * element;
  if (dst.scalar_type() == entry.dtype) {
    if (count > 0) read_bytes_at(start_byte, dst.data_ptr(), static_cast<size_t>(count) * element);
    return;
  }
  const auto flat = dst.view({-1});
  const int64_t per_chunk = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / element));
  auto buffer = torch::empty({std::min(per_chunk, count)}, torch::TensorOptions(entry.dtype));
  for (int64_t start = 0; start < count; start += per_chunk) {
    const int64_t n = std::min(per_chunk, count - start);
    auto part = buffer.narrow(0, 0, n);
    read_bytes_at(start_byte + static_cast<uint64_t>(start) * element, part.data_ptr(),
                  static_cast<size_t>(n) * element);
    flat.narrow(0, start, n).copy_(part);
  }
}

torch::Tensor SafetensorsReader::read(const SafetensorsEntry& entry) const {
  auto t = torch::empty(entry.shape, torch::TensorOptions(entry.dtype));
  if (entry.bytes > 0) read_bytes_at(entry.offset, t.data_ptr(), entry.bytes);
  return t;
}

}  // namespace trainer::checkpoint
