#include "engine/measure/op_count.h"

#include <cstring>
#include <stdexcept>

#include "util/device.h"

namespace trainer::engine {
namespace {

// The live counter: one per process, reached from autograd's threads too.
std::atomic<OpCount*> active{nullptr};
// Per thread: ATen operators entered and not yet left, and host reads in progress.
thread_local int depth = 0;
thread_local int host_reads = 0;

bool is_host_read(const at::RecordFunction& fn) {
  return std::strcmp(fn.name(), kHostRead) == 0;
}

}  // namespace

OpCount::OpCount() {
  OpCount* none = nullptr;
  if (!active.compare_exchange_strong(none, this)) {
    throw std::logic_error("one OpCount at a time");
  }
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&OpCount::enter, &OpCount::leave)
                                           .scopes({at::RecordScope::FUNCTION}));
}

OpCount::~OpCount() {
  at::removeCallback(handle_);
  active = nullptr;
}

std::unique_ptr<at::ObserverContext> OpCount::enter(const at::RecordFunction& fn) {
  if (is_host_read(fn)) {
    if (OpCount* c = active.load(); c && host_reads == 0) {
      std::lock_guard<std::mutex> lock(c->mu_);
      ++c->host_syncs_;
    }
    ++host_reads;
  } else if (fn.operator_name().has_value()) {  // an ATen operator (not an autograd range)
    if (OpCount* c = active.load()) c->count(fn, depth, host_reads > 0);
    ++depth;
  }
  return nullptr;
}

void OpCount::leave(const at::RecordFunction& fn, at::ObserverContext* /*context*/) {
  if (is_host_read(fn)) {
    --host_reads;
  } else if (fn.operator_name().has_value()) {
    --depth;
  }
}

void OpCount::count(const at::RecordFunction& fn, int at_depth, bool in_host_read) {
  std::lock_guard<std::mutex> lock(mu_);
  ++all_[fn.name()];
  if (at_depth > 0) return;
  ++top_level_[fn.name()];
  ++by_phase_[phase_];
  ++by_phase_and_name_[phase_][fn.name()];
  // `.item()` is aten::item over aten::_local_scalar_dense; either may be called directly.
  const bool item = std::strcmp(fn.name(), "aten::item") == 0 ||
                    std::strcmp(fn.name(), "aten::_local_scalar_dense") == 0;
  if (item && !in_host_read) ++host_syncs_;
}

void OpCount::set_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
}

std::map<std::string, int64_t> OpCount::top_level() const {
  std::lock_guard<std::mutex> lock(mu_);
  return top_level_;
}

std::map<std::string, int64_t> OpCount::all() const {
  std::lock_guard<std::mutex> lock(mu_);
  return all_;
}

std::map<std::string, int64_t> OpCount::by_phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_phase_;
}

std::map<std::string, std::map<std::string, int64_t>> OpCount::by_phase_and_name() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_phase_and_name_;
}

int64_t OpCount::operators() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [name, count] : top_level_) n += count;
  return n;
}

int64_t OpCount::host_syncs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return host_syncs_;
}

void OpCount::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  top_level_.clear();
  all_.clear();
  by_phase_.clear();
  by_phase_and_name_.clear();
  host_syncs_ = 0;
}

void StepCounts::begin_step() {
  const int64_t now = host_reads_made().load();
  if (reads_at_start_ < 0) reads_at_start_ = now;
  reads_before_step_ = now;
  // Steps 2 .. 1 + counted_steps_ of the run: after the first, whose work is not every step's.
  if (steps_ >= 1 && steps_ <= counted_steps_ && !count_) count_ = std::make_unique<OpCount>();
}

void StepCounts::end_step() {
  reads_in_steps_ += host_reads_made().load() - reads_before_step_;
  ++steps_;
  if (count_) {
    ops_ = count_->operators();
    ops_steps_ = steps_ - 1;
    if (steps_ > counted_steps_) count_.reset();
  }
}

double StepCounts::reads_per_step() const {
  return steps_ > 0 ? static_cast<double>(reads_in_steps_) / static_cast<double>(steps_) : 0.0;
}

int64_t StepCounts::reads_outside_steps() const {
  if (reads_at_start_ < 0) return 0;
  return host_reads_made().load() - reads_at_start_ - reads_in_steps_;
}

double StepCounts::ops_per_step() const {
  return ops_steps_ > 0 ? static_cast<double>(ops_) / static_cast<double>(ops_steps_) : 0.0;
}

}  // namespace trainer::engine
