// Counting what training dispatches: ATen operators (LibTorch's RecordFunction observer, as
// torch.profiler sees them) by phase, and host reads, the synchronisations with the device.
#pragma once

#include <ATen/record_function.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace trainer::engine {

// While alive, counts the ATen operators dispatched by this thread and by the autograd threads
// its backward passes run on. An operator that another calls (aten::linear calling aten::addmm)
// counts only in all(); top-level operators are what the trainer's own code, or autograd's
// backward functions, called. One OpCount at a time in a process.
class OpCount {
 public:
  OpCount();
  ~OpCount();
  OpCount(const OpCount&) = delete;
  OpCount& operator=(const OpCount&) = delete;

  // Attributes the operators dispatched from now on to `phase` (e.g. "forward").
  void set_phase(const std::string& phase);

  // Top-level operators, by name ("aten::add_", ...).
  std::map<std::string, int64_t> top_level() const;
  // Every operator, nested ones included, by name.
  std::map<std::string, int64_t> all() const;
  // Top-level operators by phase.
  std::map<std::string, int64_t> by_phase() const;
  // Top-level operators by phase, then name.
  std::map<std::string, std::map<std::string, int64_t>> by_phase_and_name() const;
  // Top-level operators in all.
  int64_t operators() const;
  // Host reads: the trainer's own (read_to_host, util/device.h) and `.item()` reads (top-level
  // aten::item or aten::_local_scalar_dense) outside them. Each synchronises the device.
  int64_t host_syncs() const;

  // Clears the counts.
  void reset();

 private:
  static std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn);
  static void leave(const at::RecordFunction& fn, at::ObserverContext* context);
  void count(const at::RecordFunction& fn, int depth, bool in_host_read);

  at::CallbackHandle handle_;
  mutable std::mutex mu_;
  std::string phase_ = "other";
  std::map<std::string, int64_t> top_level_, all_, by_phase_;
  std::map<std::string, std::map<std::string, int64_t>> by_phase_and_name_;
  int64_t host_syncs_ = 0;
};

// What a training run reports of its steps: the host reads made inside them and outside them
// (read_to_host's count, util/device.h: no observer, nothing per operator), and the top-level
// operators of a few steps after the first (an OpCount alive during those steps only).
class StepCounts {
 public:
  explicit StepCounts(int64_t counted_steps = 3) : counted_steps_(counted_steps) {}

  // Around each step of the run, in order.
  void begin_step();
  void end_step();

  // Host reads per step inside the steps.
  double reads_per_step() const;
  // Host reads outside the steps since this object was made.
  int64_t reads_outside_steps() const;
  // Top-level operators per counted step; 0 when the run had too few steps.
  double ops_per_step() const;

 private:
  int64_t counted_steps_;
  int64_t steps_ = 0;
  int64_t reads_in_steps_ = 0;
  int64_t reads_at_start_ = -1;  // the process's count when the first step began; -1 before
  int64_t reads_before_step_ = 0;
  int64_t ops_ = 0;
  int64_t ops_steps_ = 0;
  std::unique_ptr<OpCount> count_;  // alive during the counted steps
};

}  // namespace trainer::engine
