#include "checkpoint/pretrained_identity.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_folder.h"

namespace trainer::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kChunk = 64 << 10;  // bytes hashed at each sampled offset
constexpr uint64_t kChunks = 64;       // sampled offsets per file or tensor

// A file's label (its name within a folder), size and sampled bytes.
void sample_file(std::vector<uint8_t>& out, const fs::path& file, const std::string& label) {
  std::ifstream in(file, std::ios::binary);
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (!in || ec) throw std::runtime_error(file.string() + ": cannot be read");
  append_identity_text(out, label + ":" + std::to_string(size));
  append_identity_sample(out, size, [&](uint64_t offset, uint64_t n, uint8_t* dst) {
    in.seekg(static_cast<std::streamoff>(offset));
    in.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!in) throw std::runtime_error(file.string() + ": cannot be read");
  });
}

// The identity with a weights file alone labelled `label`.
std::string identity_of(const std::string& pretrained, const std::string& file_label) {
  std::vector<uint8_t> bytes;
  const bool folder = is_directory(pretrained);
  for (const auto& file : pretrained_identity_files(pretrained)) {
    sample_file(bytes, file, folder ? fs::path(file).filename().string() : file_label);
  }
  return xxh64_hex(bytes);
}

}  // namespace

void append_identity_text(std::vector<uint8_t>& out, const std::string& text) {
  out.insert(out.end(), text.begin(), text.end());
  out.push_back(0);
}

void append_identity_sample(std::vector<uint8_t>& out, uint64_t size, const ByteReader& read) {
  const auto append = [&](uint64_t offset, uint64_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    read(offset, n, out.data() + at);
  };
  if (size <= kChunk * kChunks) return append(0, size);
  for (uint64_t i = 0; i < kChunks; ++i) append((size - kChunk) / (kChunks - 1) * i, kChunk);
}

std::vector<std::string> pretrained_identity_files(const std::string& pretrained) {
  if (!is_directory(pretrained)) return {pretrained};
  std::vector<std::string> out;
  const fs::path config = fs::path(pretrained) / "config.json";
  std::error_code ec;
  if (fs::is_regular_file(config, ec)) out.push_back(config.string());
  for (const auto& file : hf_weight_files(pretrained)) out.push_back(file);
  std::sort(out.begin(), out.end());
  return out;
}

std::string pretrained_identity(const std::string& pretrained) {
  return identity_of(pretrained, "weights");
}

bool is_pretrained_identity(const std::string& pretrained, const std::string& recorded) {
  if (pretrained_identity(pretrained) == recorded) return true;
  return !is_directory(pretrained) &&
         identity_of(pretrained, fs::path(pretrained).filename().string()) == recorded;
}

}  // namespace trainer::checkpoint
