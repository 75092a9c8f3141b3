// Whole-file reads and crash-safe writes.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer {

// An I/O failure; the message names the path and the system's reason.
class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The whole file.
std::vector<uint8_t> read_bytes(const std::string& path);

// The first `n` bytes of the regular file `path` (fewer when it is shorter). Throws IoError.
std::vector<uint8_t> read_prefix(const std::string& path, uint64_t n);

// The size of the regular file `path`. Throws IoError.
uint64_t file_size(const std::string& path);

// What a command writes at an output path: one file (written atomically) or a folder of files.
enum class OutputKind { file, folder };

// Why `path` must not be written as a command's output of `kind`, or "" when it may be: it exists
// (symlinks followed) and is not a regular file (for OutputKind::folder, not a folder) -- a
// character device such as /dev/null, a FIFO, a socket, a folder -- which an atomic write would
// replace with a regular file; or it is one of `inputs` (the same device and inode: the same path,
// another path to it, a hard link), which writing would destroy before or while it is read. The
// message starts with `path` and says what it is; the caller adds the option's name.
std::string output_problem(const std::string& path, OutputKind kind,
                           const std::vector<std::string>& inputs = {});

// Why `path` cannot be read as an input file, or "" when it is a regular file (symlinks
// followed): "PATH: no such file", "PATH is a folder", "PATH is not a regular file (a FIFO, a
// device or a socket)" (reading a FIFO nobody writes would block), or "PATH: cannot be read
// (why)". The caller adds what to give instead.
std::string input_problem(const std::string& path);

// Receives the bytes of a file being written, in pieces.
using ByteSink = std::function<void(const void* data, size_t size)>;

// Writes `path` so that a crash at any moment leaves either the old file or the complete new one:
// the bytes `produce` passes to its sink go to a temporary file in the same directory, which is
// flushed to disk (fsync), renamed over `path`, and the directory entry is flushed too. On any
// failure the temporary file is removed, `path` is untouched, and IoError names the problem; an
// existing `path` that is not a regular file (a device, a FIFO, a folder) is such a failure, never
// replaced.
// `on_bytes`, when given, also sees every byte (e.g. to checksum them).
void write_atomically(const std::string& path, const std::function<void(const ByteSink&)>& produce,
                      const ByteSink& on_bytes = nullptr);

// write_atomically for a string.
void write_text_atomically(const std::string& path, const std::string& text);

}  // namespace trainer
