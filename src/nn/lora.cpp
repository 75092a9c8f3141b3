#include "nn/lora.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "nn/autocast.h"
#include "nn/deferred_init.h"
#include "nn/parameters.h"

namespace trainer::nn {
namespace {

std::string last_part(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// The model's nn::Linear layers under their module names, in module order.
std::vector<std::pair<std::string, LinearImpl*>> linear_layers(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, LinearImpl*>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto* layer = dynamic_cast<LinearImpl*>(item.value().get())) {
      out.emplace_back(item.key(), layer);
    }
  }
  return out;
}

std::string joined(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

// LoraTargetError unless every target names at least one of `layers`.
void check_targets(const torch::nn::Module& model, const std::vector<std::string>& targets,
                   const std::vector<std::pair<std::string, LinearImpl*>>& layers) {
  std::set<std::string> linear, other;
  for (const auto& [name, layer] : layers) linear.insert(last_part(name));
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string part = last_part(item.key());
    if (!linear.count(part) && part.find_first_not_of("0123456789") != std::string::npos) {
      other.insert(part);
    }
  }
  for (const auto& t : targets) {
    if (linear.count(t)) continue;
    throw LoraTargetError(
        "'" + t + "' " +
        (other.count(t) ? "is not a linear layer LoRA can adapt" : "names no module of the model") +
        "; the linear layers are: " + joined(linear));
  }
}

}  // namespace

double LoraOptions::scaling() const {
  const auto r = static_cast<double>(rank);
  return rslora ? alpha / std::sqrt(r) : alpha / r;
}

LoraOptions lora_options(const config::LoraConfig& cfg) {
  LoraOptions o;
  o.rank = cfg.rank;
  o.alpha = cfg.alpha;
  o.dropout = cfg.dropout;
  o.rslora = cfg.rslora;
  return o;
}

namespace {

// What torch::nn::LinearImpl's constructor allocates and draws: the real options, or for a
// planned layer a 1x1 stand-in whose parameters then take the real shapes on the meta device.
torch::nn::LinearOptions built_options(const torch::nn::LinearOptions& options) {
  return shapes_only() ? torch::nn::LinearOptions(1, 1).bias(options.bias()) : options;
}

}  // namespace

LinearImpl::LinearImpl(const torch::nn::LinearOptions& options)
    : torch::nn::LinearImpl(built_options(options)) {
  if (!shapes_only()) return;
  this->options = options;
  move_to_meta(weight, {options.out_features(), options.in_features()});
  if (bias.defined()) move_to_meta(bias, {options.out_features()});
}

namespace {
thread_local bool adapters_off = false;
}  // namespace

AdaptersOff::AdaptersOff() : previous_(adapters_off) {
  adapters_off = true;
}
AdaptersOff::~AdaptersOff() {
  adapters_off = previous_;
}
bool AdaptersOff::active() {
  return adapters_off;
}

torch::Tensor LinearImpl::base(const torch::Tensor& x) const {
  return quantized_ ? quant::quantized_linear(x, *quantized_, bias)
                    : torch::linear(x, weight, bias);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) const {
  const auto y = base(x);  // [..., out]
  if (!adapting()) return y;
  return add_update(y, torch::linear(adapter_input(x), lora_A->weight));  // h: [..., r]
}

// The adapter's input: x in its dtype (under autocast as it is: the product casts it), dropped
// out while training.
torch::Tensor LinearImpl::adapter_input(const torch::Tensor& x) const {
  const auto& a = lora_A->weight;
  const bool cast = x.scalar_type() != a.scalar_type() && !autocast_enabled(x.device().type());
  const auto in = cast ? x.to(a.scalar_type()) : x;
  return lora_.dropout > 0.0 && is_training() ? torch::dropout(in, lora_.dropout, true) : in;
}

// y + B(h) * scaling as one addmm, in the adapter's dtype (autocast's under autocast), cast back
// to y's dtype: [..., out].
torch::Tensor LinearImpl::add_update(const torch::Tensor& y, const torch::Tensor& h) const {
  const auto base = y.scalar_type() == h.scalar_type() ? y : y.to(h.scalar_type());
  const auto sum = at::addmm(base.reshape({-1, base.size(-1)}), h.reshape({-1, h.size(-1)}),
                             lora_B->weight.t(), /*beta=*/1.0, /*alpha=*/lora_.scaling());
  return sum.view(y.sizes()).to(y.scalar_type());
}

torch::Tensor LinearImpl::column_parallel(TensorParallel& tp, const torch::Tensor& x,
                                          const torch::Tensor& copied) const {
  TORCH_CHECK(!quantized_, "a quantized linear layer does not split over tensor parallelism");
  const auto y = torch::linear(copied.defined() ? copied : tp.copy_in(x), weight, bias);
  if (!adapting()) return y;  // [..., out / tp]
  // A's output whole on every rank; its gradient summed over the group's parts of B.
  return add_update(y, tp.copy_in(torch::linear(adapter_input(x), lora_A->weight)));
}

torch::Tensor LinearImpl::row_parallel(TensorParallel& tp, const torch::Tensor& x) const {
  TORCH_CHECK(!quantized_, "a quantized linear layer does not split over tensor parallelism");
  auto y = tp.reduce_out(torch::linear(x, weight));  // [..., out]
  if (adapting()) y = add_update(y, tp.reduce_out(torch::linear(adapter_input(x), lora_A->weight)));
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

void LinearImpl::add_adapter(const LoraOptions& options) {
  if (adapted()) throw std::logic_error("this linear layer has a LoRA adapter already");
  if (options.rank < 1) throw std::invalid_argument("a LoRA adapter needs a rank >= 1");
  lora_ = options;
  const auto& o = this->options;
  // nn.Linear's initialisation: kaiming_uniform_(a = sqrt(5)), PEFT's for A.
  auto a = torch::nn::Linear(torch::nn::LinearOptions(o.in_features(), options.rank).bias(false));
  auto b = torch::nn::Linear(torch::nn::LinearOptions(options.rank, o.out_features()).bias(false));
  torch::NoGradGuard no_grad;
  b->weight.zero_();
  if (weight
          .is_meta()) {  // a planned layer (nn/deferred_init.h): Module::to refuses the meta device
    move_to_meta(*a);
    move_to_meta(*b);
  } else {
    a->to(weight.device(), torch::kFloat);
    b->to(weight.device(), torch::kFloat);
  }
  lora_A = register_module("lora_A", a);
  lora_B = register_module("lora_B", b);
}

torch::Tensor lora_delta(const torch::Tensor& lora_A, const torch::Tensor& lora_B, double scaling) {
  torch::NoGradGuard no_grad;
  return torch::mm(lora_B.to(torch::kFloat), lora_A.to(torch::kFloat)).mul_(scaling);  // [out, in]
}

torch::Tensor merge_lora(const torch::Tensor& weight, const torch::Tensor& delta) {
  if (weight.sizes() != delta.sizes()) {
    throw std::invalid_argument("its update is " + c10::str(delta.sizes()) + ", the weight " +
                                c10::str(weight.sizes()));
  }
  torch::NoGradGuard no_grad;
  return (weight.to(torch::kFloat) + delta).to(weight.scalar_type());  // [out, in]
}

torch::Tensor LinearImpl::delta_weight() const {
  TORCH_CHECK(adapted(), "delta_weight: the layer has no adapter");
  return lora_delta(lora_A->weight, lora_B->weight, lora_.scaling());  // [out, in]
}

void LinearImpl::quantize_weight(quant::QuantKind kind) {
  if (quantized_) throw std::logic_error("this linear layer's weight is quantized already");
  set_quantized(quant::quantize(weight, kind));  // a split part's shape is refused there
}

void LinearImpl::set_quantized(std::shared_ptr<quant::QuantizedWeight> w) {
  const auto& o = this->options;
  const std::vector<int64_t> shape{o.out_features(), o.in_features()};
  if (w->shape() != shape) {
    throw std::invalid_argument("the quantized weight is " + c10::str(w->shape()) +
                                ", the layer's " + c10::str(shape));
  }
  quantized_ = std::move(w);
  torch::NoGradGuard no_grad;
  weight.requires_grad_(false);
  weight.set_data(torch::empty({0}, weight.options()));
}

void LinearImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::LinearImpl::to(device, dtype, non_blocking);
  if (quantized_) quantized_ = quantized_->to(device);
}

void LinearImpl::to(torch::Dtype dtype, bool non_blocking) {
  torch::nn::LinearImpl::to(dtype, non_blocking);
}

void LinearImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::LinearImpl::to(device, non_blocking);
  if (quantized_) quantized_ = quantized_->to(device);
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  torch::nn::LinearImpl::pretty_print(stream);
  if (quantized_) stream << " (quantized)";
  if (adapted()) {
    stream << " + LoRA(r=" << lora_.rank << ", alpha=" << lora_.alpha
           << ", dropout=" << lora_.dropout << (lora_.rslora ? ", rslora" : "") << ")";
  }
}

std::vector<std::string> default_lora_targets(const torch::nn::Module& model) {
  std::set<std::string> present;
  for (const auto& [name, layer] : linear_layers(model)) present.insert(last_part(name));
  std::vector<std::string> out;
  for (const char* t : {"q_proj", "v_proj", "c_attn"}) {
    if (present.count(t)) out.emplace_back(t);
  }
  return out;
}

bool is_all_linear(const std::vector<std::string>& targets) {
  if (targets.size() != 1) return false;
  std::string text = targets[0];
  for (auto& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return text == kAllLinear;
}

namespace {

// `layers` but the output layer, the module of the model's last parameter where it is one.
std::vector<std::pair<std::string, LinearImpl*>> but_output_layer(
    const torch::nn::Module& model,
    const std::vector<std::pair<std::string, LinearImpl*>>& layers) {
  const auto params = model.named_parameters(/*recurse=*/true);
  const std::string last = params.is_empty() ? "" : params.keys().back();
  std::vector<std::pair<std::string, LinearImpl*>> out;
  for (const auto& named : layers) {
    if (last.rfind(named.first + ".", 0) != 0) out.push_back(named);
  }
  return out;
}

// The linear layers `targets` name (LoraTargetError as add_adapters): for all-linear every
// nn::Linear but the output layer (the module of the model's last parameter, where it is one), as
// PEFT's _maybe_include_all_linear_layers leaves out the output embeddings.
std::vector<std::pair<std::string, LinearImpl*>> chosen_layers(
    const torch::nn::Module& model, std::vector<std::string> targets,
    const std::vector<std::pair<std::string, LinearImpl*>>& layers) {
  if (is_all_linear(targets)) {
    auto out = but_output_layer(model, layers);
    if (out.empty())
      throw LoraTargetError("all-linear: the model has no linear layer but its output layer");
    return out;
  }
  if (targets.empty()) targets = default_lora_targets(model);
  if (targets.empty()) {
    std::set<std::string> linear;
    for (const auto& [name, layer] : layers) linear.insert(last_part(name));
    throw LoraTargetError(
        "the model has none of PEFT's default targets (q_proj, v_proj, c_attn); name them, or "
        "give all-linear; the linear layers are: " +
        joined(linear));
  }
  check_targets(model, targets, layers);
  const std::set<std::string> wanted(targets.begin(), targets.end());
  std::vector<std::pair<std::string, LinearImpl*>> out;
  for (const auto& named : layers) {
    if (wanted.count(last_part(named.first))) out.push_back(named);
  }
  return out;
}

}  // namespace

std::vector<std::string> add_adapters(torch::nn::Module& model, std::vector<std::string> targets,
                                      const LoraOptions& options, c10::ScalarType base_dtype) {
  const auto layers = chosen_layers(model, std::move(targets), linear_layers(model));
  int64_t widest = 0;  // the adapted layers' largest input or output width
  for (const auto& [name, layer] : layers) {
    widest = std::max({widest, layer->options.in_features(), layer->options.out_features()});
  }
  if (options.rank > widest) {
    throw LoraRankError(std::to_string(options.rank) +
                        " is more than every adapted layer's input " +
                        "and output widths (at most " + std::to_string(widest) +
                        "): the adapters would outgrow the weights they adapt; give a rank of at "
                        "most " +
                        std::to_string(widest));
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model.parameters(/*recurse=*/true)) {
      p.requires_grad_(false);
      if (p.scalar_type() != base_dtype) p.set_data(p.to(base_dtype));
    }
  }
  std::vector<std::string> adapted;
  for (const auto& [name, layer] : layers) {
    layer->add_adapter(options);
    adapted.push_back(name);
  }
  return adapted;
}

std::vector<std::pair<std::string, LinearImpl*>> quantizable_layers(
    const torch::nn::Module& model) {
  return but_output_layer(model, linear_layers(model));
}

int64_t quantized_bytes(const torch::nn::Module& model) {
  std::vector<const quant::QuantizedWeight*> weights;
  for (const auto& [name, layer] : linear_layers(model)) {
    if (layer->quantized()) weights.push_back(layer->quantized());
  }
  return quant::held_bytes(weights);
}

int64_t quantized_parameters(const torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& [name, layer] : linear_layers(model)) {
    if (layer->quantized()) n += layer->options.in_features() * layer->options.out_features();
  }
  return n;
}

std::vector<std::pair<std::string, LinearImpl*>> adapted_layers(const torch::nn::Module& model) {
  auto layers = linear_layers(model);
  layers.erase(std::remove_if(layers.begin(), layers.end(),
                              [](const auto& named) { return !named.second->adapted(); }),
               layers.end());
  return layers;
}

SplitPlan adapter_splits(const torch::nn::Module& model, const SplitPlan& plan) {
  SplitPlan out;
  for (const auto& [name, layer] : adapted_layers(model)) {
    const auto it = plan.find(name + ".weight");
    if (it == plan.end()) continue;
    out[name + (it->second.dim == 0 ? ".lora_B.weight" : ".lora_A.weight")] = it->second;
  }
  return out;
}

bool is_adapter_tensor(const std::string& name) {
  const auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".lora_A.weight") || ends(".lora_B.weight");
}

c10::ScalarType lora_base_dtype(const std::string& name) {
  return name == "bfloat16" ? torch::kBFloat16 : name == "float16" ? torch::kHalf : torch::kFloat;
}

}  // namespace trainer::nn
