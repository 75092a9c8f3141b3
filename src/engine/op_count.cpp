#include "engine/op_count.h"

#include <cstring>
#include <stdexcept>

#include "util/device.h"

namespace trainer::engine {
namespace {

thread_local OpCount* active = nullptr;  // this thread's counter, while one lives

bool is_host_read(const at::RecordFunction& fn) {
  return std::strcmp(fn.name(), kHostRead) == 0;
}

}  // namespace

OpCount::OpCount() {
  if (active) throw std::logic_error("one OpCount per thread at a time");
  active = this;
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&OpCount::enter, &OpCount::leave)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
}

OpCount::~OpCount() {
  at::removeCallback(handle_);
  active = nullptr;
}

std::unique_ptr<at::ObserverContext> OpCount::enter(const at::RecordFunction& fn) {
  OpCount* c = active;
  if (!c) return nullptr;
  if (is_host_read(fn)) {
    if (c->in_host_read_++ == 0) ++c->host_syncs_;
  } else {
    if (c->depth_ == 0) ++c->top_level_[fn.name()];
    ++c->all_[fn.name()];
    if (c->in_host_read_ == 0 && std::strcmp(fn.name(), "aten::_local_scalar_dense") == 0) {
      ++c->host_syncs_;
    }
  }
  ++c->depth_;
  return nullptr;
}

void OpCount::leave(const at::RecordFunction& fn, at::ObserverContext* /*context*/) {
  OpCount* c = active;
  if (!c) return;
  --c->depth_;
  if (is_host_read(fn)) --c->in_host_read_;
}

int64_t OpCount::operators() const {
  int64_t n = 0;
  for (const auto& [name, count] : top_level_) n += count;
  return n;
}

void OpCount::reset() {
  top_level_.clear();
  all_.clear();
  host_syncs_ = 0;
}

}  // namespace trainer::engine
