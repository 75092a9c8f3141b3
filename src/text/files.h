// File-system helpers of the dataset readers. std::filesystem is avoided in torch-linked code:
// libtorch.so exports its own copies of some of its functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::data {

bool is_file(const std::string& path);
bool is_directory(const std::string& path);

// Size of a regular file in bytes; -1 when it cannot be read.
int64_t file_size(const std::string& path);

// The whole file; throws DataError naming the path when it cannot be read.
std::vector<uint8_t> read_file(const std::string& path);

// Entries of a directory (without "." and ".."), sorted by name in byte order; throws DataError
// naming the path when it cannot be listed.
std::vector<std::string> list_dir(const std::string& path);

// `path` without trailing slashes (except a lone "/").
std::string strip_slashes(std::string path);

}  // namespace trainer::data
