#include "nn/activation_checkpoint.h"

#include <torch/autograd.h>
#include <torch/custom_class.h>

#include <atomic>

#include "nn/autocast.h"
#include "nn/rng.h"

namespace trainer::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides the saved inputs; shared with the autograd node as a capsule.
struct Segment : torch::CustomClassHolder {
  SegmentFn fn;
  size_t num_inputs = 0;
  TensorList params;   // the owner's parameters that require grad, each once
  TensorList buffers;  // the owner's buffers, swapped for scratch copies during the rerun
  AutocastState autocast;
  torch::Tensor cpu_rng;                       // CPU generator state at forward
  std::vector<c10::DeviceIndex> cuda_devices;  // devices of the CUDA inputs
  TensorList cuda_rng;                         // their generator states at forward
  bool offload = false;                        // the inputs held in host memory until backward
  TensorList held;                             // then: the inputs' host copies
  std::vector<bool> requires_grad;             // and whether each input required grad
  std::vector<c10::Device> devices;            // and its device
};

std::atomic<int64_t> offloaded{0};

// `x` copied into host memory: pinned when it is on a CUDA device, the copy not blocking the
// host (backward's copy back is ordered after it on the same stream). A meta tensor (a planned
// model's step, counted by engine/measure/memory.h) stays a meta tensor of its shape over one
// element: the device no longer holds its bytes, which are counted as moved.
torch::Tensor to_host(const torch::Tensor& x) {
  if (!x.defined()) return x;
  if (x.is_meta()) {
    offloaded += static_cast<int64_t>(x.nbytes());
    return torch::empty({1}, x.options()).as_strided(x.sizes(), std::vector<int64_t>(x.dim(), 0));
  }
  auto host = torch::empty(x.sizes(), x.options().device(torch::kCPU).pinned_memory(x.is_cuda()));
  host.copy_(x, /*non_blocking=*/x.is_cuda());
  offloaded += static_cast<int64_t>(x.nbytes());
  return host;
}

// The inputs as forward saved them: back from host memory when offloaded.
TensorList saved_inputs(AutogradContext* ctx, const Segment& seg) {
  TensorList inputs;
  if (!seg.offload) {
    for (const auto& x : ctx->get_saved_variables()) {
      inputs.push_back(x.defined() ? x.detach().requires_grad_(x.requires_grad()) : x);
    }
    return inputs;
  }
  for (size_t i = 0; i < seg.held.size(); ++i) {
    const auto& h = seg.held[i];
    if (!h.defined()) {
      inputs.push_back(h);
      continue;
    }
    const auto device = i < seg.devices.size() ? seg.devices[i] : h.device();
    inputs.push_back(h.to(device, /*non_blocking=*/true).requires_grad_(seg.requires_grad[i]));
  }
  return inputs;
}

// Sets the generators to the segment's forward states while alive, and back afterwards, so the
// rerun draws the forward's numbers and the rest of the program sees no draw at all.
class RngFork {
 public:
  explicit RngFork(const Segment& seg) : seg_(seg) {
    auto cpu = cpu_generator();
    cpu_ = generator_state(cpu);
    set_generator_state(cpu, seg.cpu_rng);
    for (size_t i = 0; i < seg.cuda_devices.size(); ++i) {
      auto gen = cuda_generator(seg.cuda_devices[i]);
      cuda_.push_back(generator_state(gen));
      set_generator_state(gen, seg.cuda_rng[i]);
    }
  }
  ~RngFork() {
    set_generator_state(cpu_generator(), cpu_);
    for (size_t i = 0; i < cuda_.size(); ++i) {
      set_generator_state(cuda_generator(seg_.cuda_devices[i]), cuda_[i]);
    }
  }
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  const Segment& seg_;
  torch::Tensor cpu_;
  TensorList cuda_;
};

// Points each buffer at a copy of its values while alive, then back at its own storage (set_data
// keeps the tensor, its version and the module's reference to it).
class BufferSwap {
 public:
  explicit BufferSwap(const TensorList& buffers) : buffers_(buffers) {
    torch::NoGradGuard no_grad;
    for (auto& b : buffers_) {
      originals_.push_back(b.data());
      b.set_data(b.clone());
    }
  }
  ~BufferSwap() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].set_data(originals_[i]);
  }
  BufferSwap(const BufferSwap&) = delete;
  BufferSwap& operator=(const BufferSwap&) = delete;

 private:
  TensorList buffers_;
  TensorList originals_;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // `tensors`: the segment's inputs, then its parameters.
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<Segment> seg,
                               at::TensorList tensors) {
    seg->autocast = AutocastState::current();
    seg->cpu_rng = generator_state(cpu_generator());
    TensorList inputs(tensors.begin(), tensors.begin() + static_cast<long>(seg->num_inputs));
    for (const auto& x : inputs) {
      if (!x.defined() || !x.is_cuda()) continue;
      const auto index = x.device().index();
      bool seen = false;
      for (auto d : seg->cuda_devices) seen = seen || d == index;
      if (seen) continue;
      seg->cuda_devices.push_back(index);
      seg->cuda_rng.push_back(generator_state(cuda_generator(index)));
    }
    if (seg->offload) {
      for (const auto& x : inputs) {
        seg->held.push_back(to_host(x));
        seg->requires_grad.push_back(x.defined() && x.requires_grad());
        seg->devices.push_back(x.defined() ? x.device() : c10::Device(torch::kCPU));
      }
    } else {
      ctx->save_for_backward(inputs);
    }
    auto outputs = seg->fn(inputs);  // grad mode is off here: nothing inside is kept
    ctx->saved_data["segment"] = c10::IValue::make_capsule(seg);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto seg = c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data["segment"].toCapsule());
    const TensorList inputs = saved_inputs(ctx, *seg);
    seg->held.clear();  // the host copies are no longer needed
    // The rerun updates scratch copies of the buffers (batch-norm statistics were updated by the
    // forward already); the originals come back once its graph has been used.
    BufferSwap scratch(seg->buffers);
    TensorList outputs;
    {
      RngFork rng(*seg);
      AutocastGuard autocast(seg->autocast);
      torch::AutoGradMode grad(/*enabled=*/true);
      outputs = seg->fn(inputs);
    }

    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    // Slot 0 belongs to the segment argument, then one per input and parameter.
    variable_list result(1 + seg->num_inputs + seg->params.size());
    if (roots.empty()) return result;
    variable_list wrt;
    std::vector<size_t> slots;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && inputs[i].requires_grad()) {
        wrt.push_back(inputs[i]);
        slots.push_back(1 + i);
      }
    }
    for (size_t i = 0; i < seg->params.size(); ++i) {
      wrt.push_back(seg->params[i]);
      slots.push_back(1 + seg->num_inputs + i);
    }
    if (wrt.empty()) return result;
    auto grads = torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < grads.size(); ++i) result[slots[i]] = grads[i];
    return result;
  }
};

}  // namespace

TensorList checkpoint(const torch::nn::Module& module, const SegmentFn& fn,
                      const TensorList& inputs, bool offload) {
  if (!torch::GradMode::is_enabled()) return fn(inputs);
  auto seg = c10::make_intrusive<Segment>();
  seg->fn = fn;
  seg->offload = offload;
  seg->num_inputs = inputs.size();
  TensorList tensors = inputs;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;
    bool seen = false;
    for (const auto& q : seg->params) seen = seen || q.is_same(p);
    if (seen) continue;
    seg->params.push_back(p);
    tensors.push_back(p);
  }
  for (const auto& b : module.buffers(/*recurse=*/true)) seg->buffers.push_back(b);
  return CheckpointFunction::apply(seg, at::TensorList(tensors));
}

torch::Tensor checkpoint(const torch::nn::Module& module,
                         const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                         const torch::Tensor& input, bool offload) {
  return checkpoint(
      module, [fn](const TensorList& in) { return TensorList{fn(in[0])}; }, TensorList{input},
      offload)[0];
}

int64_t offloaded_bytes() {
  return offloaded.load();
}

}  // namespace trainer::nn
