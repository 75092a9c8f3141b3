// Memory a training step needs per process, estimated from measurements on the CPU: the model's
// parameters, its gradients, the optimizer's state, and the forward/backward activations measured
// at two small batch sizes and extrapolated linearly in the batch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>

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

  // Peak bytes of one training step at `batch` samples per process.
  int64_t total(int64_t batch) const {
    return params_bytes + optimizer_bytes + step_fixed_bytes + step_bytes_per_sample * batch;
  }

  // The same with dist.strategy fsdp over `world` processes: their shares of the parameters,
  // gradients (the fixed part of a step holds one set) and optimizer state, the gathered root
  // and two blocks (one computing, the next prefetched) with their gradients, and the
  // activations.
  int64_t fsdp_total(int64_t batch, int64_t world) const {
    const int64_t activations = std::max<int64_t>(step_fixed_bytes - params_bytes, 0);
    const int64_t gathered = 2 * (root_bytes + 2 * largest_block_bytes);
    return (2 * params_bytes + optimizer_bytes) / std::max<int64_t>(world, 1) + gathered +
           activations + step_bytes_per_sample * batch;
  }

  // The same with dist.tp_size `tp` over `world` processes (world / tp data-parallel ranks): the
  // parameters and optimizer state split over the tensor-parallel group (the few whole tensors,
  // layer norms and position embeddings, counted as split) and with fsdp sharded over the
  // data-parallel ranks too, the gathered units split as well; the step (gradients and
  // activations) as Megatron-LM counts a transformer layer's activations (Korthikanti et al.,
  // 2022): of 34 bytes per token and unit of width, 24 split over the group and 10 whole.
  int64_t tp_total(int64_t batch, int64_t tp, int64_t world, bool fsdp) const {
    const int64_t t = std::max<int64_t>(tp, 1), dp = std::max<int64_t>(world / t, 1);
    const int64_t state = (params_bytes + optimizer_bytes) / t / (fsdp ? dp : 1);
    const int64_t gathered = fsdp ? 2 * (root_bytes + 2 * largest_block_bytes) / t : 0;
    const int64_t step = step_fixed_bytes + step_bytes_per_sample * batch;
    return state + gathered + step * (10 * t + 24) / (34 * t);
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
