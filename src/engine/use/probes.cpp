#include "engine/use/probes.h"

#include <torch/torch.h>

#include <algorithm>

#include "engine/measure/flops.h"
#include "nn/autocast.h"

namespace trainer::engine {

data::Batch first_samples(const Components& parts, int64_t batch) {
  std::vector<int64_t> indices(static_cast<size_t>(batch));
  const int64_t n = parts.splits.train->size();
  for (int64_t i = 0; i < batch; ++i) indices[static_cast<size_t>(i)] = i % n;
  return parts.splits.train->get(indices);
}

int64_t forward_flops(Components& parts, int64_t batch) {
  const auto inputs = first_samples(parts, batch).inputs.to(parts.device);  // [B, ...]
  // Evaluation mode leaves batch-norm statistics alone; the counted operations are the same.
  torch::NoGradGuard no_grad;
  parts.model->eval();
  if (parts.fsdp) parts.fsdp->gather_root();  // the blocks are gathered as they run
  const int64_t flops = count_flops([&] {
    nn::AutocastGuard autocast(parts.device.type(), parts.precision.dtype,
                               parts.precision.autocast);
    parts.model->forward(inputs);
  });
  if (parts.fsdp) parts.fsdp->release_root();
  parts.model->train();
  return flops;
}

int64_t step_peak(Components& parts, models::NetImpl& net, bool bf16, int64_t batch) {
  if (!parts.device.is_cpu()) {
    throw std::logic_error("memory measurement: the model must be on the CPU");
  }
  const data::Batch b = first_samples(parts, batch);
  net.zero_grad(/*set_to_none=*/true);
  const int64_t peak = measure_cpu_peak([&] {
    torch::Tensor loss;
    {
      nn::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, /*enabled=*/bf16);
      loss = parts.loss(net.forward(b.inputs), b.targets);
    }
    loss.backward();
  });
  net.zero_grad(/*set_to_none=*/true);
  return peak;
}

MemoryEstimate estimate_memory(Components& parts, const config::ModelConfig& model, bool bf16,
                               const std::string& checkpointing) {
  // Another checkpointing setting: a twin of the model (its weights do not matter here).
  models::Net twin = parts.model;
  if (!checkpointing.empty() && checkpointing != model.checkpointing) {
    auto twin_cfg = model;
    twin_cfg.checkpointing = checkpointing;
    twin = models::build_model(twin_cfg, parts.input);
  }
  MemoryEstimate e;
  e.dtype = bf16 ? "bfloat16" : "float32";
  int64_t trainable = 0;  // what the optimizer updates (model.lora: the adapters)
  for (const auto& p : parts.params) {
    trainable += p.numel() * static_cast<int64_t>(p.element_size());
  }
  e.params_bytes = trainable;
  if (!parts.fsdp) {  // the frozen ones too (model.lora's base)
    e.params_bytes = 0;
    for (const auto& p : models::unique_parameters(*parts.model)) {
      e.params_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    }
  }
  e.optimizer_bytes = parts.optimizer->state_copies() * trainable;
  int64_t in_blocks = 0;
  for (const auto& block : parts.model->blocks()) {
    int64_t bytes = 0;
    for (const auto& p : block->parameters(/*recurse=*/true)) {
      bytes += p.numel() * static_cast<int64_t>(p.element_size());
    }
    in_blocks += bytes;
    e.largest_block_bytes = std::max(e.largest_block_bytes, bytes);
  }
  e.root_bytes = std::max<int64_t>(e.params_bytes - in_blocks, 0);
  // Batch norm needs more than one sample per channel in training mode.
  e.measured_batch_small = 2;
  e.measured_batch_large = 4;
  const int64_t small = step_peak(parts, *twin, bf16, e.measured_batch_small);
  const int64_t large = step_peak(parts, *twin, bf16, e.measured_batch_large);
  e.step_bytes_per_sample =
      std::max<int64_t>((large - small) / (e.measured_batch_large - e.measured_batch_small), 0);
  e.step_fixed_bytes =
      std::max<int64_t>(small - e.step_bytes_per_sample * e.measured_batch_small, 0);
  return e;
}

}  // namespace trainer::engine
