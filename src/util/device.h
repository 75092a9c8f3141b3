// What the trainer's code needs around LibTorch's device work: the one way it reads results to the
// host (which synchronises with the device), and an error's message without LibTorch's backtrace.
// Header-only: the torch-free libraries never include it.
#pragma once

#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace trainer {

// The name every host read carries for the profiler and engine::OpCount.
constexpr const char* kHostRead = "trainer::host_read";

// The host reads (read_to_host) made so far by this process, on any thread.
inline std::atomic<int64_t>& host_reads_made() {
  static std::atomic<int64_t> count{0};
  return count;
}

// `t` copied to the host. Synchronises the device: waits for the work that produces `t`.
inline torch::Tensor read_to_host(const torch::Tensor& t) {
  RECORD_FUNCTION(kHostRead, std::vector<c10::IValue>());
  host_reads_made().fetch_add(1, std::memory_order_relaxed);
  return t.to(torch::kCPU);
}

// The value of one-element `t` (read_to_host: synchronises the device).
inline double host_double(const torch::Tensor& t) {
  return *read_to_host(t).to(torch::kDouble).data_ptr<double>();
}
inline int64_t host_int(const torch::Tensor& t) {
  return *read_to_host(t).to(torch::kLong).data_ptr<int64_t>();
}

// The first line of `e`'s message, without a LibTorch backtrace.
inline std::string error_line(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10 ? c10->what_without_backtrace() : e.what();
  return text.substr(0, text.find('\n'));
}

}  // namespace trainer
