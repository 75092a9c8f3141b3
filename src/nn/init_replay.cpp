#include "nn/init_replay.h"

#include <torch/torch.h>

#include "nn/rng.h"

namespace trainer::nn {

namespace {
thread_local InitReplay* active = nullptr;
}  // namespace

InitReplay::InitReplay() : before_(active) {
  active = this;
}

InitReplay::~InitReplay() {
  active = before_;
}

RecordedDraws InitReplay::take() {
  return std::move(draws_);
}

bool replaying() {
  return active != nullptr;
}

void normal_or_record(torch::Tensor& p, double mean, double std) {
  torch::NoGradGuard no_grad;
  if (!active) {
    p.normal_(mean, std);
    return;
  }
  active->draws_[p.unsafeGetTensorImpl()] =
      RecordedDraw{generator_state(cpu_generator()), p.scalar_type(), mean, std};
  p.set_data(torch::empty_like(p));
  torch::empty_like(p).normal_(mean, std);  // the generator moves on as the plain draw moves it
}

void release_matrices(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters(/*recurse=*/true)) {
    if (p.dim() == 2) p.set_data(torch::empty_like(p));
  }
}

at::Tensor redraw(const RecordedDraw& draw, at::IntArrayRef sizes) {
  auto gen = cpu_generator();
  const auto saved = generator_state(gen);
  set_generator_state(gen, draw.generator_state);
  auto values = torch::empty(sizes, torch::TensorOptions().dtype(draw.dtype));
  values.normal_(draw.mean, draw.std);
  set_generator_state(gen, saved);
  return values;
}

}  // namespace trainer::nn
