#include "util/fileio.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace trainer {
namespace {

std::string reason() {
  return std::strerror(errno);
}

std::string parent_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

namespace {

// An open regular file, closed on scope exit.
struct ReadFile {
  explicit ReadFile(const std::string& path) : path(path) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(path + ": cannot open: " + reason());
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw IoError(path + ": not a regular file");
    }
  }
  ~ReadFile() { ::close(fd); }
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;

  // Fills `bytes` from the start of the file.
  void read_into(std::vector<uint8_t>& bytes) const {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n =
          ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw IoError(path + ": read error: " + (n < 0 ? reason() : "file shrank while reading"));
      }
      done += static_cast<size_t>(n);
    }
  }

  std::string path;
  int fd = -1;
  struct stat st {};
};

}  // namespace

std::vector<uint8_t> read_bytes(const std::string& path) {
  const ReadFile f(path);
  std::vector<uint8_t> bytes(static_cast<size_t>(f.st.st_size));
  f.read_into(bytes);
  return bytes;
}

std::vector<uint8_t> read_prefix(const std::string& path, uint64_t n) {
  const ReadFile f(path);
  std::vector<uint8_t> bytes(static_cast<size_t>(std::min<uint64_t>(n, f.st.st_size)));
  f.read_into(bytes);
  return bytes;
}

uint64_t file_size(const std::string& path) {
  return static_cast<uint64_t>(ReadFile(path).st.st_size);
}

void write_atomically(const std::string& path, const std::function<void(const ByteSink&)>& produce,
                      const ByteSink& on_bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(tmp + ": cannot create: " + reason());
  auto fail = [&](const std::string& what) {
    const std::string why = reason();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw IoError(tmp + ": " + what + ": " + why);
  };
  const ByteSink sink = [&](const void* data, size_t size) {
    if (on_bytes) on_bytes(data, size);
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd, p, size);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("write failed");
      p += n;
      size -= static_cast<size_t>(n);
    }
  };
  try {
    produce(sink);
  } catch (const IoError&) {
    throw;
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    const std::string why = reason();
    ::unlink(tmp.c_str());
    throw IoError(tmp + ": close failed: " + why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = reason();
    ::unlink(tmp.c_str());
    throw IoError(path + ": cannot rename " + tmp + " to it: " + why);
  }
  // The rename is durable once the directory is flushed.
  const int dir = ::open(parent_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void write_text_atomically(const std::string& path, const std::string& text) {
  write_atomically(path, [&](const ByteSink& sink) { sink(text.data(), text.size()); });
}

}  // namespace trainer
