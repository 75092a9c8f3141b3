// Reading and setting the states of LibTorch's default random-number generators, under each
// generator's lock (checkpoints save them; activation checkpointing replays them).
#pragma once

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <mutex>

namespace trainer::nn {

inline at::Generator cpu_generator() {
  return at::detail::getDefaultCPUGenerator();
}

inline at::Generator cuda_generator(c10::DeviceIndex index) {
  return at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, index));
}

inline at::Tensor generator_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

inline void set_generator_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// For its lifetime, the CPU generator draws from `seed`; then it gets back the state it had. What
// is drawn inside depends on `seed` alone, what is drawn after on what came before alone.
class SeededDraws {
 public:
  explicit SeededDraws(uint64_t seed) : saved_(generator_state(cpu_generator())) {
    auto gen = cpu_generator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
  ~SeededDraws() { set_generator_state(cpu_generator(), saved_); }
  SeededDraws(const SeededDraws&) = delete;
  SeededDraws& operator=(const SeededDraws&) = delete;

 private:
  at::Tensor saved_;
};

}  // namespace trainer::nn
