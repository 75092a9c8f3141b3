// The memory plan: what one process of a training job holds at its peak, part by part, for the
// job's layout (processes, tensor parallelism, fsdp) on a GPU or on the CPU, from a step's
// memory estimate (memory.h). `trainer doctor --config` prints it against the device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/measure/memory.h"

namespace trainer::engine {

// Where and how the job runs.
struct JobLayout {
  int64_t batch = 1;  // samples per process and micro-step (data.batch_size)
  int64_t world = 1;  // processes in the job
  int64_t tp = 1;     // dist.tp_size: world / tp data-parallel ranks
  bool fsdp = false;  // dist.strategy fsdp: state sharded over the data-parallel ranks
  bool gpu = false;   // a CUDA device: the context and, with world > 1, NCCL's buffers count
};

// One part of a process's peak.
struct MemoryPart {
  std::string name;  // "parameters (bfloat16)", "gradients", "activations", ...
  int64_t bytes = 0;
};

struct MemoryPlan {
  std::vector<MemoryPart> parts;  // in the order printed; none of 0 bytes but the parameters
  int64_t total() const;
};

// What the CUDA context of a process takes on its device (the driver's and the runtime's state,
// the kernels loaded as they are first used, cuBLAS's workspace): an allowance, the figure
// gpu_check measures.
constexpr int64_t kCudaContextBytes = int64_t{512} << 20;
// What one NCCL communicator takes on each device (NCCL_BUFFSIZE's 4 MiB for each channel's send
// and receive buffer, for ring and tree algorithms over up to 32 channels): an allowance.
constexpr int64_t kNcclCommunicatorBytes = int64_t{512} << 20;

// What the vocabulary-parallel cross-entropy (distributed/tensor_parallel.h) holds per logit of
// its rank's share [N, V / tp] at the end of its forward: the logits in float32, less their
// maximum, their exponentials and the softmax it keeps for the backward, 4 bytes each.
constexpr int64_t kVocabularyParallelLossBytes = 16;

// A process's peak for `job`, from `e` (measured in one process, the whole model):
//   parameters, each dtype as held (a quantized base as its quantized bytes), a frozen reference
//   copy of them (a full fine-tune's DPO), gradients and optimizer state: split over the
//   tensor-parallel group (its few whole tensors counted as split) and with fsdp sharded over the
//   data-parallel ranks; activations: the step's peak beyond the gradients, at job.batch; with
//   tensor parallelism as Megatron-LM counts a transformer layer's (Korthikanti et al., 2022): of
//   34 bytes per token and unit of width, 24 split over the group and 10 whole, and the
//   vocabulary-parallel loss's buffers of a language model (e.logits_per_sample); temporaries: the
//   largest quantized layer's weight dequantized for its product; under fsdp the gathered root and
//   two blocks (one computing, the next prefetched) with their gradients; on a GPU the CUDA context
//   and each NCCL communicator (the job's, and with tensor parallelism the tensor-parallel and
//   data-parallel groups'), and a twentieth of the rest for the caching allocator's fragmentation.
MemoryPlan plan_memory(const MemoryEstimate& e, const JobLayout& job);

// "12.3 GiB (parameters (bfloat16) 4.0 GiB, gradients 1.0 GiB, ...)": the plan on one line.
std::string plan_text(const MemoryPlan& plan);

}  // namespace trainer::engine
