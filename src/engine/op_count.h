// Counting what a piece of training dispatches: ATen operators (LibTorch's RecordFunction
// observer, as torch.profiler sees them) and host reads, the synchronisations with the device.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <map>
#include <string>

namespace trainer::engine {

// While alive, counts the operators this thread dispatches. Operators that others call
// (aten::linear calling aten::addmm) count only as `all`; `top_level` counts what the trainer's own
// code called. One OpCount per thread at a time.
class OpCount {
 public:
  OpCount();
  ~OpCount();
  OpCount(const OpCount&) = delete;
  OpCount& operator=(const OpCount&) = delete;

  // Top-level operators, by name ("aten::add_", ...).
  const std::map<std::string, int64_t>& top_level() const { return top_level_; }
  // Every operator, nested ones included, by name.
  const std::map<std::string, int64_t>& all() const { return all_; }
  // Top-level operators in all.
  int64_t operators() const;
  // Host reads: the trainer's own (read_to_host, util/device.h) and LibTorch's `.item()` reads
  // (aten::_local_scalar_dense) outside them. Each synchronises the device.
  int64_t host_syncs() const { return host_syncs_; }

  // Clears the counts.
  void reset();

 private:
  static std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn);
  static void leave(const at::RecordFunction& fn, at::ObserverContext* context);

  at::CallbackHandle handle_;
  int depth_ = 0;  // operators entered and not yet left
  int in_host_read_ = 0;
  std::map<std::string, int64_t> top_level_, all_;
  int64_t host_syncs_ = 0;
};

}  // namespace trainer::engine
