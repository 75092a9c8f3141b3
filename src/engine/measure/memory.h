// Memory a training step needs per process, estimated from measurements on the CPU: the model's
// parameters, its gradients, the optimizer's state, and the forward/backward activations measured
// at two small batch sizes and extrapolated linearly in the batch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace trainer::engine {

struct MemoryEstimate {
  std::string dtype;                  // "float32", or "bfloat16" (autocast)
  int64_t params_bytes = 0;           // parameters (tied weights once)
  int64_t optimizer_bytes = 0;        // momentum buffers / Adam moments
  int64_t step_fixed_bytes = 0;       // batch-independent part of the forward/backward peak
  int64_t step_bytes_per_sample = 0;  // activations and gradients' growth per sample
  int64_t measured_batch_small = 0, measured_batch_large = 0;  // the two measured batches
  int64_t root_bytes = 0;           // parameters outside the model's blocks (fsdp's root unit)
  int64_t largest_block_bytes = 0;  // the parameters of the model's largest block
  // params_bytes by the dtype they are held in ("float32", "bfloat16", "nf4", "int8"): a
  // quantized base (model.lora.base_quant) counted as its quantized bytes.
  std::vector<std::pair<std::string, int64_t>> params_by_dtype;
  int64_t gradient_bytes = 0;     // the trainable parameters' gradients (part of the step)
  int64_t dequantized_bytes = 0;  // the largest quantized weight dequantized for its product
  int64_t reference_bytes = 0;    // a frozen copy of the parameters (a full fine-tune's DPO)
  // The model's outputs per sample: a classifier's logits, a language model's tokens x vocabulary
  // (a vocabulary-parallel loss holds several float32 copies of its share).
  int64_t logits_per_sample = 0;

  // Peak bytes of one training step at `batch` samples per process, in one process
  // (memory_plan.h's plan_memory gives any layout's, part by part).
  int64_t total(int64_t batch) const {
    return params_bytes + optimizer_bytes + step_fixed_bytes + step_bytes_per_sample * batch +
           dequantized_bytes + reference_bytes;
  }
};

// The CUDA caching allocator's figures for one device, in bytes.
struct DeviceMemory {
  int64_t peak = 0;      // the most held by tensors since the last reset_cuda_peak
  int64_t reserved = 0;  // taken from the device, cached blocks included
};

// The allocator's figures for CUDA device `index` (host bookkeeping: no device synchronisation).
DeviceMemory cuda_memory(int index);
// The memory of CUDA device `index` in bytes (asks the driver).
int64_t cuda_total_memory(int index);
// Starts a new peak for cuda_memory(index).peak at the bytes held now.
void reset_cuda_peak(int index);

// The peak bytes the CPU allocator had out while `fn` ran, above what it had out when it began.
// Tensors made before and freed during `fn` may make the figure slightly low.
int64_t measure_cpu_peak(const std::function<void()>& fn);

// The same for `fn` computing on meta tensors (a planned model, engine/setup/components.h's
// Build::plan): the peak bytes its meta tensors would have held had they had storage, counted as
// the CPU allocator counts (each tensor's bytes from its making to its release), with no memory
// taken.
int64_t measure_meta_peak(const std::function<void()>& fn);

}  // namespace trainer::engine
