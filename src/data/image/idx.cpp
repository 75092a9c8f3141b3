#include "data/image/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

namespace trainer::data {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw IdxError(path + ": " + what);
}

bool valid_type(uint8_t code) {
  switch (code) {
    case 0x08:
    case 0x09:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x0E:
      return true;
    default:
      return false;
  }
}

std::string hex_byte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%02x", b);
  return buf;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// The whole file, as stored on disk.
std::vector<uint8_t> read_raw(const std::string& path, std::FILE* f) {
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    size_t n = std::fread(chunk.data(), 1, chunk.size(), f);
    out.insert(out.end(), chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(n));
    if (n < chunk.size()) {
      if (std::ferror(f)) fail(path, std::string("read error: ") + std::strerror(errno));
      break;
    }
  }
  return out;
}

// The decompressed contents of the gzip file at `path`.
std::vector<uint8_t> read_gzip(const std::string& path) {
  std::unique_ptr<gzFile_s, GzCloser> gz(gzopen(path.c_str(), "rb"));
  if (!gz) fail(path, std::string("cannot open: ") + std::strerror(errno));
  gzbuffer(gz.get(), 1 << 17);
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    int n = gzread(gz.get(), chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int errnum = 0;
      const char* msg = gzerror(gz.get(), &errnum);
      fail(path, std::string("corrupt gzip stream: ") + (msg ? msg : "unknown error"));
    }
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
    if (n == 0) break;
  }
  // gzread reports a stream cut short only through gzerror, after returning 0.
  int errnum = Z_OK;
  const char* msg = gzerror(gz.get(), &errnum);
  if (errnum != Z_OK) {
    fail(path, std::string("corrupt gzip stream: ") + (msg ? msg : "unknown error"));
  }
  return out;
}

}  // namespace

int64_t idx_element_size(IdxType type) {
  switch (type) {
    case IdxType::kUInt8:
    case IdxType::kInt8:
      return 1;
    case IdxType::kInt16:
      return 2;
    case IdxType::kInt32:
    case IdxType::kFloat32:
      return 4;
    case IdxType::kFloat64:
      return 8;
  }
  return 0;
}

int64_t IdxArray::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

IdxArray parse_idx(const std::vector<uint8_t>& bytes, const std::string& path) {
  if (bytes.size() < 4) {
    fail(path,
         "truncated: expected a 4-byte header, found " + std::to_string(bytes.size()) + " bytes");
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    fail(path, "bad magic: expected the file to start with two zero bytes, found " +
                   hex_byte(bytes[0]) + " " + hex_byte(bytes[1]) + " (not an IDX file)");
  }
  const uint8_t code = bytes[2];
  if (!valid_type(code)) {
    fail(path, "bad magic: unknown element type code " + hex_byte(code) +
                   " (expected 0x08, 0x09, 0x0b, 0x0c, 0x0d or 0x0e)");
  }
  const int ndims = bytes[3];
  if (ndims < 1 || ndims > 4) {
    fail(path, "bad magic: number of dimensions " + std::to_string(ndims) + " not in 1..4");
  }
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (bytes.size() < header) {
    fail(path, "truncated: expected a " + std::to_string(header) + "-byte header, found " +
                   std::to_string(bytes.size()) + " bytes");
  }
  IdxArray out;
  out.type = static_cast<IdxType>(code);
  const int64_t elem = idx_element_size(out.type);
  // Dimension sizes are below 2^32, so the running product stays below the limit checked here.
  constexpr int64_t kMaxBytes = int64_t{1} << 40;
  int64_t expected = elem;
  for (int i = 0; i < ndims; ++i) {
    const uint8_t* p = bytes.data() + 4 + 4 * i;
    const int64_t d = (int64_t{p[0]} << 24) | (int64_t{p[1]} << 16) | (int64_t{p[2]} << 8) | p[3];
    out.dims.push_back(d);
    expected *= d;
    if (expected > kMaxBytes) {
      fail(path,
           "implausible dimensions: more than " + std::to_string(kMaxBytes) + " bytes of data");
    }
  }
  const int64_t found = static_cast<int64_t>(bytes.size() - header);
  if (found < expected) {
    fail(path, "truncated: expected " + std::to_string(expected) + " bytes of data, found " +
                   std::to_string(found));
  }
  if (found > expected) {
    fail(path, "trailing data: expected " + std::to_string(expected) + " bytes of data, found " +
                   std::to_string(found));
  }
  out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return out;
}

IdxArray read_idx(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  unsigned char magic[2] = {0, 0};
  const size_t n = std::fread(magic, 1, 2, f.get());
  const bool gzip = n == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  if (gzip) {
    f.reset();
    return parse_idx(read_gzip(path), path);
  }
  std::rewind(f.get());
  return parse_idx(read_raw(path, f.get()), path);
}

}  // namespace trainer::data
