#include "engine/observe/memory_history.h"

#include <filesystem>
#include <stdexcept>

#include "util/fileio.h"
#include "util/format.h"
#include "util/log.h"

#ifdef TRAINER_WITH_CUDA
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

namespace trainer::engine {

MemoryHistory::MemoryHistory(const config::ProfileConfig& cfg, torch::Device device,
                             std::string run_dir, int rank)
    : at_step_(cfg.memory_snapshot_step) {
  if (!cfg.memory_snapshot || !device.is_cuda()) return;
  const std::string name =
      rank == 0 ? "memory_snapshot.pickle" : strprintf("memory_snapshot.rank%d.pickle", rank);
  path_ = (std::filesystem::path(run_dir) / name).string();
#ifdef TRAINER_WITH_CUDA
  // Every allocation and free with its C++ stack, as _record_memory_history("all") keeps them,
  // up to 100,000 entries.
  torch::cuda::_record_memory_history(/*enabled=*/"all", /*context=*/"all", /*stacks=*/"all",
                                      /*max_entries=*/100000);
  recording_ = true;
#else
  throw std::runtime_error(
      "profile.memory_snapshot: this trainer was built without CUDA support; set it false");
#endif
}

MemoryHistory::~MemoryHistory() {
#ifdef TRAINER_WITH_CUDA
  if (recording_) torch::cuda::_record_memory_history(/*enabled=*/std::nullopt);
#endif
}

void MemoryHistory::after(int64_t step) {
  if (recording_ && at_step_ > 0 && step == at_step_) {
    const std::string path = write();
    if (!path.empty())
      log::info(strprintf("memory snapshot after step %" PRId64 ": %s", step, path.c_str()));
  }
}

std::string MemoryHistory::write() {
  if (!recording_) return "";
#ifdef TRAINER_WITH_CUDA
  try {
    const std::string bytes = torch::cuda::_memory_snapshot_pickled();
    write_text_atomically(path_, bytes);
    return path_;
  } catch (const std::exception& e) {
    log::error("profile.memory_snapshot: " + path_ + " not written: " + e.what());
  }
#endif
  return "";
}

}  // namespace trainer::engine
