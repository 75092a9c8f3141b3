// Writing IDX files (raw or gzip-compressed) for the data tests.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

namespace trainer::test_support {

// The bytes of an IDX file: the header for `type` and `dims`, then `payload`.
inline std::vector<uint8_t> idx_bytes(uint8_t type, const std::vector<uint32_t>& dims,
                                      const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// Writes `bytes` to `path`, through gzip when `gzip`.
inline void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes,
                        bool gzip) {
  if (gzip) {
    gzFile gz = gzopen(path.string().c_str(), "wb");
    ASSERT_NE(gz, nullptr) << path;
    if (!bytes.empty()) {
      EXPECT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())),
                static_cast<int>(bytes.size()));
    }
    gzclose(gz);
  } else {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  }
}

}  // namespace trainer::test_support
