// Tar shards as WebDataset writes them: the shard list of a brace pattern, the members of a tar
// file (read from their headers alone, with pread), and the reads of a member's bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::data {

// The names of a brace pattern, as webdataset's braceexpand and bash: "{000..146}" counts up and
// "{146..000}" down (zero-padded to the longer end's width when either end starts with a zero),
// "{a,b}" lists; several braces multiply, left to right. Throws std::invalid_argument naming the
// pattern for an unclosed brace, a range of non-numbers, or more than a million names (counted
// before any is made).
std::vector<std::string> expand_braces(const std::string& pattern);

// A regular file in a tar archive: its name and where its bytes are.
struct TarMember {
  std::string name;
  int64_t offset = 0;  // of its first byte in the archive
  int64_t size = 0;    // in bytes
};

// The regular files of a tar archive, in archive order. Reading stops at the end-of-archive
// block, or early at the first header that is unreadable or whose data the file cuts off; then
// `problem` says where and why, `cut_name` names the member that was cut (if its header could be
// read), and `members` holds the complete ones before it.
struct TarListing {
  std::vector<TarMember> members;
  std::string problem;   // empty: the archive is whole
  std::string cut_name;  // the member whose data was cut off
};

class RandomAccessFile;

// Lists the tar archive `file` (ustar, GNU long names, pax `path` records) from its headers.
TarListing list_tar(const RandomAccessFile& file);

// One file open for reads at any offset, from any thread at once.
class RandomAccessFile {
 public:
  // Throws DataError naming the path when it cannot be opened.
  explicit RandomAccessFile(std::string path);
  ~RandomAccessFile();
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  // `size` bytes from `offset`; throws DataError naming the path when they cannot all be read.
  std::vector<uint8_t> read(int64_t offset, int64_t size) const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

}  // namespace trainer::data
