// trainer bench --kernels: the fused normalisation, activation and rotary kernels (nn/fused*_ops.h)
// and the ATen compositions they replace, timed on a GPU at the sizes of GPT-2 small and a
// Llama-3.2-1B-shaped model, as bytes moved per second against the device's copy rate: the
// kernels are memory-bound, so the copy rate is their ceiling.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

namespace trainer::engine {

struct KernelRow {
  std::string name;                  // e.g. "layer_norm + residual, forward"
  std::string shape;                 // e.g. "16384 x 768 bf16"
  double bytes = 0;                  // bytes the pass reads and writes at least (each tensor once)
  double fused_ms = 0, aten_ms = 0;  // best of the repeats
  double fused_gbps = 0, aten_gbps = 0;
  double of_copy = 0;  // fused_gbps / the device's copy rate
};

struct KernelReport {
  std::string device;
  double copy_gbps = 0;  // device copy, bytes read plus written per second
  std::vector<KernelRow> rows;
};

// Each kernel's forward and forward + backward (the backward's bytes added), in bfloat16, fused
// and as ATen's operators, the best of `repeats` after one untimed run. Reads the device. Throws
// std::runtime_error when `device` is not a CUDA device or the build has no fused kernels.
KernelReport bench_kernels(torch::Device device, int repeats = 20);

}  // namespace trainer::engine
