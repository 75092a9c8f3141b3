#include "engine/loop/async_writer.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <utility>

#include "util/device.h"

namespace trainer::engine {
namespace {

// A copy of `t` on the host, queued on the current stream (pinned for a CUDA tensor).
torch::Tensor queued_copy(const torch::Tensor& t, bool& device) {
  if (!t.defined()) return t;
  if (!t.is_cuda()) return t.clone();
  device = true;
  auto out = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true));
  out.copy_(t, /*non_blocking=*/true);
  return out;
}

// Waits for the copies queued on the device: one host read.
void wait_for_copies() {
  RECORD_FUNCTION(kHostRead, std::vector<c10::IValue>());
  host_reads_made().fetch_add(1, std::memory_order_relaxed);
  torch::cuda::synchronize();
}

}  // namespace

AsyncWriter::~AsyncWriter() {
  if (thread_.joinable()) thread_.join();
}

void AsyncWriter::start(std::function<void()> job) {
  wait();
  thread_ = std::thread([this, job = std::move(job)] {
    try {
      job();
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void AsyncWriter::wait() {
  if (!thread_.joinable()) return;
  thread_.join();
  if (auto error = std::exchange(error_, nullptr)) std::rethrow_exception(error);
}

checkpoint::NamedTensors host_copy(const checkpoint::NamedTensors& tensors) {
  checkpoint::NamedTensors out;
  bool device = false;
  for (const auto& [name, t] : tensors) out.emplace_back(name, queued_copy(t, device));
  if (device) wait_for_copies();
  return out;
}

std::vector<checkpoint::ShardPiece> host_copy(std::vector<checkpoint::ShardPiece> pieces) {
  bool device = false;
  for (auto& piece : pieces) piece.data = queued_copy(piece.data, device);
  if (device) wait_for_copies();
  return pieces;
}

}  // namespace trainer::engine
