#include "engine/use/probes.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "engine/measure/flops.h"
#include "engine/measure/run_peak.h"
#include "nn/autocast.h"
#include "nn/deferred_init.h"
#include "nn/lora.h"
#include "nn/parameters.h"
#include "nn/quant/quantized_weight.h"

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

int64_t train_step_flops(Components& parts, int64_t batch) {
  const auto inputs = first_samples(parts, batch).inputs.to(parts.device);  // [B, ...]
  parts.model->eval();  // batch-norm statistics and dropout's draws left alone
  if (parts.fsdp) parts.fsdp->gather_root();
  const int64_t flops = count_train_flops([&] {
    nn::AutocastGuard autocast(parts.device.type(), parts.precision.dtype,
                               parts.precision.autocast);
    parts.model->forward(inputs);
  });
  if (parts.fsdp) parts.fsdp->release_root();
  parts.model->train();
  return flops;
}

namespace {

// A planned model's step (Build::plan) on meta tensors. Meta tensors do not take autocast, so
// bfloat16 autocast is emulated: the floating parameters are bfloat16 while the step runs and
// the outputs go to the loss in float32, as autocast computes it; what autocast holds beyond
// that is added: a bfloat16 copy of each trainable weight (its cache) and float32 gradients where
// the emulation makes bfloat16 ones, 4 bytes a trainable element.
int64_t planned_step_peak(Components& parts, models::NetImpl& net, bool bf16, const data::Batch& b,
                          int64_t& outputs_numel) {
  // Meta tensor `p` as one of `dtype` in place (every handle of it), no storage either way.
  const auto retype = [](torch::Tensor& p, c10::ScalarType dtype) {
    p.unsafeGetTensorImpl()->shallow_copy_from(
        at::empty_strided(p.sizes(), p.strides(), p.options().dtype(dtype)).getIntrusivePtr());
  };
  std::vector<torch::Tensor> cast;  // the float32 parameters made bfloat16 for the step
  int64_t autocast_extra = 0;
  if (bf16) {
    for (auto& p : models::unique_parameters(net)) {
      if (p.scalar_type() != torch::kFloat) continue;
      retype(p, torch::kBFloat16);
      cast.push_back(p);
      if (p.requires_grad()) autocast_extra += 4 * p.numel();
    }
  }
  const auto restore = [&] {
    for (auto& p : cast) retype(p, torch::kFloat);
  };
  const auto inputs = b.inputs.to(torch::kMeta), targets = b.targets.to(torch::kMeta);
  int64_t peak = 0;
  try {
    peak = measure_meta_peak([&] {
      auto outputs = net.forward(inputs);
      outputs_numel = outputs.numel();
      if (bf16 && outputs.is_floating_point()) outputs = outputs.to(torch::kFloat);
      parts.loss(outputs, targets).backward();
    });
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return peak + autocast_extra;
}

}  // namespace

int64_t step_peak(Components& parts, models::NetImpl& net, bool bf16, int64_t batch,
                  int64_t* outputs) {
  const auto params = net.parameters(/*recurse=*/true);
  const bool planned = !params.empty() && params.front().is_meta();
  if (!planned && !parts.device.is_cpu()) {
    throw std::logic_error("memory measurement: the model must be on the CPU");
  }
  const data::Batch b = first_samples(parts, batch);
  net.zero_grad(/*set_to_none=*/true);
  int64_t numel = 0;
  const int64_t peak =
      planned ? planned_step_peak(parts, net, bf16, b, numel) : measure_cpu_peak([&] {
        torch::Tensor loss;
        {
          nn::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, /*enabled=*/bf16);
          const auto out = net.forward(b.inputs);
          numel = out.numel();
          loss = parts.loss(out, b.targets);
        }
        loss.backward();
      });
  net.zero_grad(/*set_to_none=*/true);
  if (outputs) *outputs = numel;
  return peak;
}

namespace {

// A twin of the model built with `checkpointing` (its weights do not matter here): planned (on the
// meta device) or built.
models::Net twin_of(const Components& parts, const config::ModelConfig& model,
                    const std::string& checkpointing, bool planned) {
  auto twin_cfg = model;
  twin_cfg.checkpointing = checkpointing;
  nn::DeferredInit deferred(planned ? nn::Deferral::shapes_only : nn::Deferral::none);
  auto twin = models::build_model(twin_cfg, parts.input);
  if (planned) nn::move_to_meta(*twin);
  return twin;
}

// A planned model whose step runs an operator meta tensors lack (a convolution): up to this many
// bytes of parameters, its step is measured on a built twin instead.
constexpr int64_t kBuiltTwinLimit = int64_t{1} << 30;

// The step's peak at batches `small` and `large` of `net`, or where `net` is planned and its step
// cannot run on meta tensors, of a built twin (models up to kBuiltTwinLimit bytes); `outputs`:
// the elements of the model's outputs at `small`.
std::pair<int64_t, int64_t> step_peaks(Components& parts, const config::ModelConfig& model,
                                       const models::Net& net, const std::string& checkpointing,
                                       bool bf16, int64_t params_bytes, int64_t small,
                                       int64_t large, int64_t& outputs) {
  try {
    return {step_peak(parts, *net, bf16, small, &outputs), step_peak(parts, *net, bf16, large)};
  } catch (const c10::Error& e) {
    const auto params = net->parameters(/*recurse=*/true);
    if (params.empty() || !params.front().is_meta() || params_bytes > kBuiltTwinLimit) throw;
  }
  const auto built = twin_of(parts, model, checkpointing, /*planned=*/false);
  return {step_peak(parts, *built, bf16, small, &outputs), step_peak(parts, *built, bf16, large)};
}

// The parameters `model` holds by dtype into e.params_by_dtype and e.params_bytes: with
// model.lora.base_quant, its quantizable layers' weights as their quantized bytes (counted from
// their shapes on a planned model, whose weights are not quantized; measured on a built one) and
// e.dequantized_bytes, the largest of them dequantized into the step's dtype.
void count_held(MemoryEstimate& e, models::NetImpl& net, const config::ModelConfig& model,
                bool bf16) {
  std::map<std::string, int64_t> by_dtype;
  for (const auto& p : models::unique_parameters(net)) {
    by_dtype[dtype_name(p.scalar_type())] += p.numel() * static_cast<int64_t>(p.element_size());
  }
  const auto kind = model.lora.enabled() ? nn::quant::quant_kind(model.lora.base_quant)
                                         : nn::quant::QuantKind::none;
  if (kind != nn::quant::QuantKind::none) {
    const int64_t held = nn::quantized_bytes(net);  // a built model's quantized weights
    int64_t planned = held > 0 ? held : nn::quant::shared_table_bytes(kind), largest = 0;
    for (const auto& [name, layer] : nn::quantizable_layers(net)) {
      const auto& w = layer->weight;
      if (layer->quantized() || !w.defined()) continue;
      const int64_t numel = w.numel();
      by_dtype[dtype_name(w.scalar_type())] -= numel * static_cast<int64_t>(w.element_size());
      planned += nn::quant::planned_bytes(w.sizes().vec(), kind);
      largest = std::max(largest, numel * (bf16 ? 2 : static_cast<int64_t>(w.element_size())));
    }
    by_dtype[model.lora.base_quant] += planned;
    if (held == 0) e.dequantized_bytes = largest;
  }
  e.params_bytes = 0;
  e.params_by_dtype.clear();
  for (const auto& [dtype, bytes] : by_dtype) {
    if (bytes <= 0) continue;
    e.params_by_dtype.emplace_back(dtype, bytes);
    e.params_bytes += bytes;
  }
}

}  // namespace

MemoryEstimate estimate_memory(Components& parts, const config::ModelConfig& model, bool bf16,
                               const std::string& checkpointing) {
  // Another checkpointing setting: a twin of the model.
  const bool other = !checkpointing.empty() && checkpointing != model.checkpointing;
  const models::Net net =
      other ? twin_of(parts, model, checkpointing, parts.build == Build::plan) : parts.model;
  MemoryEstimate e;
  e.dtype = bf16 ? "bfloat16" : "float32";
  int64_t trainable = 0;  // what the optimizer updates (model.lora: the adapters)
  for (const auto& p : parts.params) {
    trainable += p.numel() * static_cast<int64_t>(p.element_size());
  }
  e.params_bytes = trainable;
  e.gradient_bytes = trainable;
  if (!parts.fsdp) count_held(e, *parts.model, model, bf16);  // the frozen ones too
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
  int64_t outputs = 0;
  const auto [small, large] =
      step_peaks(parts, model, net, other ? checkpointing : model.checkpointing, bf16,
                 e.params_bytes, e.measured_batch_small, e.measured_batch_large, outputs);
  e.logits_per_sample = outputs / e.measured_batch_small;
  e.step_bytes_per_sample =
      std::max<int64_t>((large - small) / (e.measured_batch_large - e.measured_batch_small), 0);
  e.step_fixed_bytes =
      std::max<int64_t>(small - e.step_bytes_per_sample * e.measured_batch_small, 0);
  return e;
}

}  // namespace trainer::engine
