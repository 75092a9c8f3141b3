// profile.memory_snapshot: the CUDA caching allocator's history (the C++ side of
// torch.cuda.memory._record_memory_history), recorded from the start of training and written as
// a pickle that torch.cuda._memory_viz and https://pytorch.org/memory_viz render: after
// profile.memory_snapshot_step, and when a step runs out of memory.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "config/config.h"

namespace trainer::engine {

class MemoryHistory {
 public:
  // Starts recording when profile.memory_snapshot is set and `device` is a GPU (the config check
  // refuses it on the CPU). Throws std::runtime_error when this LibTorch has no CUDA.
  MemoryHistory(const config::ProfileConfig& cfg, torch::Device device, std::string run_dir,
                int rank);
  // Stops recording.
  ~MemoryHistory();
  MemoryHistory(const MemoryHistory&) = delete;
  MemoryHistory& operator=(const MemoryHistory&) = delete;

  // After step `step`: writes the snapshot at profile.memory_snapshot_step.
  void after(int64_t step);

  // Writes the snapshot now as <run.dir>/memory_snapshot.pickle (rank N > 0:
  // memory_snapshot.rank<N>.pickle) and returns its path; "" when not recording or when it could
  // not be written (logged). Reads the allocator's state, not the device.
  std::string write();

 private:
  bool recording_ = false;
  int64_t at_step_ = 0;
  std::string path_;
};

}  // namespace trainer::engine
