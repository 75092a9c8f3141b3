// LoRA (low-rank adaptation) as PEFT defines it (peft/tuners/lora/layer.py): a linear layer whose
// weight stays frozen, plus a trainable low-rank update,
//
//   y = x W^T + b + B(A(dropout(x))) * scaling      A [r, in], B [out, r]
//
// A drawn kaiming-uniform (a = sqrt(5), as nn.Linear's weight), B zeros (so an adapter starts as
// the identity update), scaling alpha / r (alpha / sqrt(r) with rank-stabilised LoRA). The models
// build their projections as nn::Linear; add_adapters() attaches adapters to the layers a config
// names, freezes everything else and casts the frozen base to its dtype. The adapters' state-dict
// names are PEFT's without the adapter's name: `<layer>.lora_A.weight`, `<layer>.lora_B.weight`.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "nn/quant/quantized_weight.h"
#include "nn/tensor_parallel.h"

namespace trainer::nn {

struct LoraOptions {
  int64_t rank = 8;      // r
  double alpha = 8.0;    // lora_alpha
  double dropout = 0.0;  // on the adapter's input while training
  bool rslora = false;   // scaling alpha / sqrt(r) instead of alpha / r

  // What B(A(x)) is multiplied by.
  double scaling() const;
};

// The options of a model.lora section.
LoraOptions lora_options(const config::LoraConfig& cfg);

// What merging an adapter adds to its layer's weight: scaling * B @ A [out, in] in float32, of
// lora_A [r, in] and lora_B [out, r] of any floating dtype (PEFT's get_delta_weight).
torch::Tensor lora_delta(const torch::Tensor& lora_A, const torch::Tensor& lora_B, double scaling);

// `weight` [out, in] with `delta` (lora_delta's) merged in: their sum in float32, rounded once to
// the weight's dtype (PEFT's merge_and_unload). Throws std::invalid_argument when the shapes
// differ.
torch::Tensor merge_lora(const torch::Tensor& weight, const torch::Tensor& delta);

// While one lives on this thread, every adapted layer computes its base layer alone, as PEFT's
// disable_adapter() context does: the frozen base model, the reference of preference tuning
// (engine/loop/preference_step.h). Nests; restores the previous state when destroyed.
class AdaptersOff {
 public:
  AdaptersOff();
  ~AdaptersOff();
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;
  // Whether adapters are off on this thread.
  static bool active();

 private:
  bool previous_;
};

// torch::nn::Linear (its parameters, names and initialisation) that may carry a LoRA adapter.
class LinearImpl : public torch::nn::LinearImpl {
 public:
  // Under nn::shapes_only() (nn/deferred_init.h) the weight and bias are on the meta device from
  // the start: the layer never allocates or draws them.
  explicit LinearImpl(const torch::nn::LinearOptions& options);

  // x [..., in] -> [..., out]: the layer, plus the adapter's update when it has one (in the
  // adapter's dtype, x cast to it, the sum cast back to the layer's output dtype, as PEFT does).
  torch::Tensor forward(const torch::Tensor& x) const;

  // Under tensor parallelism (nn/tensor_parallel.h), as a column-parallel layer: x [..., in]
  // whole on every rank, the weight this rank's rows -> this rank's outputs [..., out / tp]. The
  // adapter's A is whole, its B this rank's rows: B(copy_in(A(dropout(x)))) * scaling, so that
  // A's gradient is the group's sum. `copied`: tp.copy_in(x) when the caller made it already
  // (for several layers reading x), else made here. Every rank of the group must run the
  // backward through it, in the same order.
  torch::Tensor column_parallel(TensorParallel& tp, const torch::Tensor& x,
                                const torch::Tensor& copied = {}) const;
  // As a row-parallel layer: x [..., in / tp] this rank's inputs, the weight its columns, the
  // bias whole -> y [..., out] summed over the group. The adapter's A is this rank's columns, its
  // B whole: B(reduce_out(A(dropout(x)))) * scaling (a second, rank-wide all-reduce). Every rank
  // of the group must call this, in the same order.
  torch::Tensor row_parallel(TensorParallel& tp, const torch::Tensor& x) const;

  // Attaches an adapter (submodules lora_A [r, in] and lora_B [out, r], float32, on the
  // weight's device), A drawn from the global generator. Throws std::logic_error when it has one.
  void add_adapter(const LoraOptions& options);
  bool adapted() const { return !lora_A.is_empty(); }
  // Whether forward adds the adapter's update: adapted, and not under AdaptersOff.
  bool adapting() const { return adapted() && !AdaptersOff::active(); }
  const LoraOptions& adapter_options() const { return lora_; }

  // lora_delta of the adapter: what merging it adds to the weight, [out, in] float32.
  torch::Tensor delta_weight() const;

  // model.lora.base_quant: the weight, frozen, held as `kind` (nn/quant/quantized_weight.h)
  // from now on; `weight` keeps no elements and forward multiplies by the quantized weight.
  // Throws std::invalid_argument (quant::quantize's, or a split part's shape: set_quantized's) and
  // std::logic_error when quantized already.
  void quantize_weight(quant::QuantKind kind);
  // The weight given as `w` (its shape the layer's [out, in]), held as quantize_weight holds it.
  // Throws std::invalid_argument naming both shapes when they differ.
  void set_quantized(std::shared_ptr<quant::QuantizedWeight> w);
  // The quantized weight, or nullptr.
  const quant::QuantizedWeight* quantized() const { return quantized_.get(); }

  // Module::to, moving the quantized weight with the parameters (a dtype leaves it as it is).
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  void pretty_print(std::ostream& stream) const override;

  torch::nn::Linear lora_A{nullptr};  // [r, in], no bias
  torch::nn::Linear lora_B{nullptr};  // [out, r], no bias

 private:
  torch::Tensor adapter_input(const torch::Tensor& x) const;
  torch::Tensor add_update(const torch::Tensor& y, const torch::Tensor& h) const;
  // x W^T + b, W the weight or the quantized one.
  torch::Tensor base(const torch::Tensor& x) const;

  LoraOptions lora_;
  std::shared_ptr<quant::QuantizedWeight> quantized_;
};
TORCH_MODULE(Linear);

// A target of model.lora.targets that names no layer LoRA can adapt: the message names the
// target and the linear layers the model has.
class LoraTargetError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A model.lora.rank larger than every adapted layer's input and output widths.
class LoraRankError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The targets PEFT adapts when its config names none: its default for Llama/Qwen (q_proj,
// v_proj) and GPT-2 (c_attn), those of them the model has.
std::vector<std::string> default_lora_targets(const torch::nn::Module& model);

// PEFT's shorthand for every linear layer but the output layer (its target_modules="all-linear"),
// as model.lora.targets' one entry.
inline constexpr const char* kAllLinear = "all-linear";

// Whether `targets` is [all-linear] (kAllLinear, in any case, as PEFT compares it).
bool is_all_linear(const std::vector<std::string>& targets);

// Attaches an adapter to every nn::Linear of `model` whose module name's last part is one of
// `targets` (empty: default_lora_targets; [all-linear]: every nn::Linear but the output layer,
// the module holding the model's last parameter, as PEFT resolves it: llama's and gpt's lm_head
// is no nn::Linear, an mlp's last layer is), freezes every other parameter (requires_grad false)
// and casts them to `base_dtype`. Returns the adapted layers' module names, in module order.
// Throws LoraTargetError, before changing anything, when a target names no nn::Linear, and
// LoraRankError when the rank exceeds the adapted layers' widths.
std::vector<std::string> add_adapters(torch::nn::Module& model, std::vector<std::string> targets,
                                      const LoraOptions& options, c10::ScalarType base_dtype);

// The layers model.lora.base_quant quantizes: every nn::Linear of `model` but the output layer
// (as all-linear resolves them, and as transformers leaves the output embeddings out of
// bitsandbytes' conversion), under their module names, in module order.
std::vector<std::pair<std::string, LinearImpl*>> quantizable_layers(const torch::nn::Module& model);

// Bytes the quantized weights of `model`'s linear layers hold (quant::held_bytes), and the
// parameters they stand for.
int64_t quantized_bytes(const torch::nn::Module& model);
int64_t quantized_parameters(const torch::nn::Module& model);

// The adapted layers of `model` under their module names, in module order.
std::vector<std::pair<std::string, LinearImpl*>> adapted_layers(const torch::nn::Module& model);

// How the adapters split over a tensor-parallel group whose layers split as `plan` says (a model's
// split_over): a column-parallel layer's (weight split along dim 0) lora_B as its weight, a
// row-parallel layer's (dim 1) lora_A as its weight; the other adapter matrix whole.
SplitPlan adapter_splits(const torch::nn::Module& model, const SplitPlan& plan);

// Whether `name` (a state-dict name) is an adapter's tensor: it ends in .lora_A.weight or
// .lora_B.weight.
bool is_adapter_tensor(const std::string& name);

// The dtype a model.lora.base_dtype names: float32, bfloat16 or float16.
c10::ScalarType lora_base_dtype(const std::string& name);

}  // namespace trainer::nn
