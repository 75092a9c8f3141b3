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

// What kind of file `st` describes, for messages: "a character device", "a FIFO", ...
std::string file_type(const struct stat& st) {
  if (S_ISDIR(st.st_mode)) return "a folder";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISREG(st.st_mode)) return "a regular file";
  return "not a regular file";
}

}  // namespace

std::string input_problem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return path + (errno == ENOENT || errno == ENOTDIR
                       ? ": no such file"
                       : ": cannot be read (" + std::string(std::strerror(errno)) + ")");
  }
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return path + " is a folder";
  return path + " is not a regular file (a FIFO, a device or a socket)";
}

std::string output_problem(const std::string& path, OutputKind kind,
                           const std::vector<std::string>& inputs) {
  struct stat out {};
  if (::stat(path.c_str(), &out) != 0) return "";  // nothing there (or unreachable: the write says)
  const bool folder = kind == OutputKind::folder;
  if (folder && !S_ISDIR(out.st_mode)) {
    return path + " is " + file_type(out) +
           ", not a folder; name a folder for the output (it is created if missing)";
  }
  if (!folder && !S_ISREG(out.st_mode)) {
    return path + " is " + file_type(out) +
           ", not a regular file: the output would replace it with one; name a regular file (an "
           "old one is replaced atomically) or a new path";
  }
  for (const auto& input : inputs) {
    struct stat in {};
    if (::stat(input.c_str(), &in) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino) {
      return path + " is the input " + input +
             (input == path ? "" : " (the same file under another name)") +
             ": writing the output there would destroy the input; choose another output";
    }
  }
  return "";
}

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
  struct stat there {};
  if (::stat(path.c_str(), &there) == 0 && !S_ISREG(there.st_mode)) {
    ::unlink(tmp.c_str());
    throw IoError(path + ": is " + file_type(there) + ", not a regular file; not replaced");
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
