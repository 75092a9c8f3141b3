// Measurements of a built run that `trainer doctor` and `trainer bench` report: the model's
// FLOPs and a training step's memory.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "data/dataset.h"
#include "engine/measure/memory.h"
#include "engine/setup/components.h"

namespace trainer::engine {

// The first `batch` training samples (repeated when the split is smaller), on the CPU.
data::Batch first_samples(const Components& parts, int64_t batch);

// The floating-point operations of one forward pass over `batch` training samples
// (engine/measure/flops.h), under autocast when the run uses it. Leaves the model in training mode.
// With dist.strategy fsdp in a group every rank must call this, in the same order (the blocks are
// gathered).
int64_t forward_flops(Components& parts, int64_t batch);

// The model FLOPs of a training step over `batch` training samples (engine/measure/flops.h's
// count_train_flops): the forward and what its backward computes, which leaves out the weight
// gradients of frozen weights (LoRA's base); under autocast when the run uses it. Leaves the
// model in training mode. With dist.strategy fsdp in a group every rank must call this, in the
// same order.
int64_t train_step_flops(Components& parts, int64_t batch);

// The measured CPU peak of one forward/backward of `net` at `batch` training samples (float32 or
// bfloat16 autocast), without parameters and optimizer state. The model must be on the CPU.
// `outputs`, when given, is set to the number of elements of the model's outputs (its logits).
int64_t step_peak(Components& parts, models::NetImpl& net, bool bf16, int64_t batch,
                  int64_t* outputs = nullptr);

// The memory of a training step (engine/measure/memory.h), measured on the CPU in float32 or under
// bfloat16 autocast; the model must be on the CPU. Leaves the model and optimizer as they were.
// A `checkpointing` setting other than "" measures a twin of the model built with that
// model.checkpointing; throws models::ModelError when the model has no blocks.
MemoryEstimate estimate_memory(Components& parts, const config::ModelConfig& model, bool bf16,
                               const std::string& checkpointing);

}  // namespace trainer::engine
