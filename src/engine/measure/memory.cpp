#include "engine/measure/memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "engine/measure/meta_kernels.h"

namespace trainer::engine {
namespace {

// The bytes an allocator has out and their peak since the last reset, under its lock.
class Tally {
 public:
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    live_ = 0;
    peak_ = 0;
  }
  int64_t peak() {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

 protected:
  // With mu_ held.
  void add(int64_t bytes) {
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }

  std::mutex mu_;
  int64_t live_ = 0;
  int64_t peak_ = 0;
};

// Wraps the CPU allocator and counts the bytes it has out. Installed only while measuring; the
// tensors it made keep its deleter, so it lives as long as the process (one instance). The data
// pointer doubles as the context, as raw_allocate() requires.
class CountingAllocator final : public c10::Allocator, public Tally {
 public:
  static CountingAllocator& instance() {
    static CountingAllocator* counting = new CountingAllocator(c10::GetCPUAllocator());
    return *counting;
  }

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    {
      std::lock_guard<std::mutex> lock(mu_);
      add(static_cast<int64_t>(n));
      blocks_.emplace(data, Block{std::move(inner), n});
    }
    return c10::DataPtr(data, data, &release, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  c10::Allocator* inner() const { return inner_; }

 private:
  struct Block {
    c10::DataPtr memory;
    size_t bytes;
  };
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  static void release(void* data) {
    auto& self = instance();
    c10::DataPtr memory;  // freed when it goes out of scope, outside the lock
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      auto it = self.blocks_.find(data);
      if (it == self.blocks_.end()) return;
      self.live_ -= static_cast<int64_t>(it->second.bytes);
      memory = std::move(it->second.memory);
      self.blocks_.erase(it);
    }
  }

  c10::Allocator* inner_;
  std::unordered_map<void*, Block> blocks_;
};

// Stands in for the meta device's allocator (which hands out no memory) and counts the bytes its
// tensors would hold: each allocation's context records its size. Installed only while
// measuring; one instance, living as long as the process (its tensors keep its deleter).
class MetaCountingAllocator final : public c10::Allocator, public Tally {
 public:
  static MetaCountingAllocator& instance() {
    static auto* counting = new MetaCountingAllocator(c10::GetAllocator(c10::DeviceType::Meta));
    return *counting;
  }

  c10::DataPtr allocate(size_t n) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      add(static_cast<int64_t>(n));
    }
    return c10::DataPtr(nullptr, new size_t(n), &release, c10::Device(c10::DeviceType::Meta));
  }

  void copy_data(void* /*dest*/, const void* /*src*/, std::size_t /*count*/) const override {}

  c10::Allocator* inner() const { return inner_; }

 private:
  explicit MetaCountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  static void release(void* context) {
    auto* bytes = static_cast<size_t*>(context);
    auto& self = instance();
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      self.live_ -= static_cast<int64_t>(*bytes);
    }
    delete bytes;
  }

  c10::Allocator* inner_;
};

// Runs `fn` with `counting` installed as the allocator of `device` (above the default's
// priority), then the one before it again, also when `fn` throws.
template <typename Counting>
int64_t peak_while(c10::DeviceType device, Counting& counting, const std::function<void()>& fn) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  constexpr uint8_t kPriority = 100;  // above the default allocator's
  counting.reset();
  c10::SetAllocator(device, &counting, kPriority);
  try {
    fn();
  } catch (...) {
    c10::SetAllocator(device, counting.inner(), kPriority);
    throw;
  }
  c10::SetAllocator(device, counting.inner(), kPriority);
  return std::max<int64_t>(counting.peak(), 0);
}

}  // namespace

DeviceMemory cuda_memory(int index) {
  auto* allocator = c10::getDeviceAllocator(c10::kCUDA);
  const auto device = static_cast<c10::DeviceIndex>(index);
  const auto stats = allocator->getDeviceStats(device);
  const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  DeviceMemory out;
  out.peak = stats.allocated_bytes[all].peak;
  out.reserved = stats.reserved_bytes[all].current;
  return out;
}

int64_t cuda_total_memory(int index) {
  const auto device = static_cast<c10::DeviceIndex>(index);
  return static_cast<int64_t>(c10::getDeviceAllocator(c10::kCUDA)->getMemoryInfo(device).second);
}

void reset_cuda_peak(int index) {
  c10::getDeviceAllocator(c10::kCUDA)->resetPeakStats(static_cast<c10::DeviceIndex>(index));
}

int64_t measure_cpu_peak(const std::function<void()>& fn) {
  return peak_while(c10::DeviceType::CPU, CountingAllocator::instance(), fn);
}

int64_t measure_meta_peak(const std::function<void()>& fn) {
  register_meta_kernels();
  return peak_while(c10::DeviceType::Meta, MetaCountingAllocator::instance(), fn);
}

}  // namespace trainer::engine
