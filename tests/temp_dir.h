// A fresh directory for one test, removed with its contents when the object goes away.
#pragma once

#include <ftw.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

namespace trainer::test_support {

class TempDir {
 public:
  // Creates <system temp dir>/trainer_<tag>_<pid>_<random>.
  explicit TempDir(const std::string& tag) {
    path_ = std::filesystem::temp_directory_path() /
            ("trainer_" + tag + "_" + std::to_string(::getpid()) + "_" +
             std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    // nftw rather than std::filesystem::remove_all: libtorch.so exports its own copy of
    // remove_all, which crashes when a torch-linked binary calls it.
    ::nftw(path_.c_str(), remove_entry, /*nopenfd=*/16, FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  static int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
    return std::remove(path);
  }
  std::filesystem::path path_;
};

}  // namespace trainer::test_support
