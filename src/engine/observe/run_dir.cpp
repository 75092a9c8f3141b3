#include "engine/observe/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "util/log.h"
#include "util/net/net.h"

namespace trainer::engine {
namespace fs = std::filesystem;
namespace {

// What of an earlier run `dir` holds ("" when nothing): checkpoint files (with the newest step)
// and a non-empty metrics.jsonl.
std::string earlier_run(const fs::path& dir) {
  std::string found;
  int64_t newest = -1;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir / "checkpoints", ec)) {
    newest = std::max(newest, checkpoint::checkpoint_step(e.path().filename().string()));
  }
  if (newest >= 0) found = "checkpoints up to step " + std::to_string(newest);
  if (fs::is_regular_file(dir / "metrics.jsonl", ec) &&
      fs::file_size(dir / "metrics.jsonl", ec) > 0) {
    found += std::string(found.empty() ? "" : ", ") + "metrics.jsonl";
  }
  return found;
}

// <dir>.replaced-<UTC time>, with a counter when that exists already.
fs::path aside_path(const std::string& dir) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &utc);
  std::string base = fs::path(dir).lexically_normal().string();
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  fs::path out = base + ".replaced-" + stamp;
  for (int i = 2; fs::exists(out); ++i) out = base + ".replaced-" + stamp + "-" + std::to_string(i);
  return out;
}

}  // namespace

RunDir::RunDir(const config::LoadedConfig& loaded, bool resuming)
    : loaded_(loaded), dir_(loaded.cfg.run.dir) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    throw config::ConfigError({config::Issue{
        loaded_.where("run.dir"), "run.dir",
        dir_ + ": cannot create the run dir: " + ec.message() + "; choose another --run-dir"}});
  }
  lock();
  if (!resuming) start_fresh();
  const fs::path checkpoints = fs::path(dir_) / "checkpoints";
  if (fs::exists(checkpoints, ec) && !fs::is_directory(checkpoints, ec)) {
    throw config::ConfigError({config::Issue{
        loaded_.where("run.dir"), "run.dir",
        checkpoints.string() +
            " is not a directory, so no checkpoint could be saved; remove it or choose another "
            "--run-dir"}});
  }
  if (::access(dir_.c_str(), W_OK) != 0) {
    throw config::ConfigError({config::Issue{
        loaded_.where("run.dir"), "run.dir",
        dir_ + " is not writable (" + std::strerror(errno) + "); choose another --run-dir"}});
  }
}

RunDir::~RunDir() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

void RunDir::lock() {
  const std::string path = dir_ + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw config::ConfigError(
        {config::Issue{loaded_.where("run.dir"), "run.dir",
                       path + ": cannot create the run dir's lock (" + std::strerror(errno) +
                           "); choose a writable --run-dir"}});
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    std::ifstream in(path);
    std::string pid, host;
    in >> pid >> host;
    ::close(fd_);
    fd_ = -1;
    throw RunDirInUse(dir_ + " is in use by another trainer (pid " + (pid.empty() ? "?" : pid) +
                      " on " + (host.empty() ? "?" : host) + ", holding " + path +
                      "); wait for it to end or choose another --run-dir");
  }
  const std::string me = std::to_string(::getpid()) + " " + host_name("unknown host") + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
    log::warn(path + ": cannot record this process in the lock: " + std::strerror(errno));
  }
}

void RunDir::start_fresh() {
  const std::string earlier = earlier_run(dir_);
  if (earlier.empty()) return;
  if (!loaded_.cfg.run.overwrite) {
    throw config::ConfigError(
        {config::Issue{loaded_.where("run.dir"), "run.dir",
                       dir_ + " holds another run (" + earlier +
                           "); continue it with --resume auto, choose another --run-dir, or set "
                           "run.overwrite: true to move its contents aside and start over"}});
  }
  const fs::path aside = aside_path(dir_);
  fs::create_directories(aside);
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().filename() == ".lock") continue;
    fs::rename(e.path(), aside / e.path().filename());
  }
  log::warn("run.overwrite: the earlier run of " + dir_ + " (" + earlier + ") moved to " +
            aside.string());
}

}  // namespace trainer::engine
