#include "engine/persist/async_writer.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <map>
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

// queued_copy of `t`, or the copy already made of the same tensor (a tied weight under its other
// name), so that the copies share as the originals do and the checkpoint stores them once.
torch::Tensor shared_copy(const torch::Tensor& t, std::map<const void*, torch::Tensor>& made,
                          bool& device) {
  if (!t.defined()) return t;
  auto [it, fresh] = made.emplace(t.unsafeGetTensorImpl(), torch::Tensor());
  if (fresh) it->second = queued_copy(t, device);
  return it->second;
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
  std::map<const void*, torch::Tensor> made;
  bool device = false;
  for (const auto& [name, t] : tensors) out.emplace_back(name, shared_copy(t, made, device));
  if (device) wait_for_copies();
  return out;
}

std::vector<checkpoint::ShardPiece> host_copy(std::vector<checkpoint::ShardPiece> pieces) {
  std::map<const void*, torch::Tensor> made;
  bool device = false;
  for (auto& piece : pieces) piece.data = shared_copy(piece.data, made, device);
  if (device) wait_for_copies();
  return pieces;
}

}  // namespace trainer::engine
