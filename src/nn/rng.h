// Reading and setting the states of LibTorch's default random-number generators, under each
// generator's lock (checkpoints save them; activation checkpointing replays them).
#pragma once

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

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

}  // namespace trainer::nn
