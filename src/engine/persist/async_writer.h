// run.checkpoint_async's parts: a copy of the state that training cannot change, and the
// background thread that writes it.
#pragma once

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace trainer::engine {

// Runs one job at a time on a thread of its own.
class AsyncWriter {
 public:
  AsyncWriter() = default;
  // Waits for the job in flight (its exception, if any, is dropped).
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Starts `job` on a new thread; waits for the one in flight first.
  void start(std::function<void()> job);
  // Waits for the job in flight and rethrows what it threw; nothing when none is in flight.
  void wait();
  bool busy() const { return thread_.joinable(); }

 private:
  std::thread thread_;
  std::exception_ptr error_;
};

// Copies of `tensors` in host memory that training cannot change: CPU tensors cloned, CUDA
// tensors copied into pinned memory; a tensor given under several names (tied) copied once and
// shared by them. Reads the device: waits for the copies to land.
checkpoint::NamedTensors host_copy(const checkpoint::NamedTensors& tensors);
std::vector<checkpoint::ShardPiece> host_copy(std::vector<checkpoint::ShardPiece> pieces);

}  // namespace trainer::engine
