// The Trainer's uses of a model besides training: loading weights alone, evaluation of a
// split, prediction, decoding, and the input pipeline's rate.
#include <torch/torch.h>

#include <chrono>

#include "engine/loop/batches.h"
#include "engine/loop/trainer.h"
#include "engine/loop/trainer_state.h"
#include "engine/observe/metrics.h"
#include "engine/use/probes.h"
#include "nn/autocast.h"
#include "nn/lora.h"
#include "util/device.h"

namespace trainer::engine {

double Trainer::input_samples_per_sec(int64_t steps, double min_seconds) {
  auto& p = s_->parts;
  StepBatches batches(*p.train_loader, s_->state, p.steps_per_epoch,
                      s_->loaded.cfg.train.grad_accum_steps);
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int64_t samples = 0;
  for (int64_t i = 0; i < steps || elapsed() < min_seconds; ++i) {
    if (!batches.has_step()) batches.next_epoch();
    for (const auto& b : batches.next()) samples += b.targets.size(0);
    ++s_->state.step_in_epoch;
  }
  const double took = elapsed();
  return took > 0 ? static_cast<double>(samples) / took : 0.0;
}

HeldState Trainer::held_state() const {
  const auto& p = s_->parts;
  HeldState h;
  for (const auto& t : p.params) {
    h.params += t.numel() * static_cast<int64_t>(t.element_size());
    if (t.grad().defined())
      h.grads += t.grad().numel() * static_cast<int64_t>(t.grad().element_size());
  }
  for (const auto& named : p.optimizer->state()) {
    h.optimizer += named.second.numel() * static_cast<int64_t>(named.second.element_size());
  }
  if (p.fsdp) return h;
  h.quantized = nn::quantized_bytes(*p.model);
  for (const auto& t : models::unique_parameters(*p.model)) {  // frozen ones: model.lora's base
    if (!t.requires_grad()) h.params += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return h;
}

distributed::CommBytes Trainer::communicated() const {
  const auto& p = s_->parts;
  distributed::CommBytes out;
  for (const auto* g : {p.group.get(), p.tp_group.get(), p.dp_group.get()}) {
    if (g) out = out + g->communicated();
  }
  return out;
}

distributed::Group* Trainer::group() const {
  return s_->parts.group.get();
}

int64_t Trainer::load_model(const std::string& path, LabelUse labels,
                            const checkpoint::State* loaded, WeightsUse weights) {
  return s_->state.step = s_->checkpointer.load_model(path, labels, loaded, weights);
}

bool Trainer::loaded_average() const {
  return s_->checkpointer.used_average();
}

namespace {

// A model's decoder run under the config's autocast, as training and evaluation run it.
class AutocastDecoder final : public models::Decoder {
 public:
  AutocastDecoder(std::unique_ptr<models::Decoder> inner, torch::Device device,
                  const Precision& precision)
      : inner_(std::move(inner)), device_(device), precision_(precision) {}

  torch::Tensor next_logits(const torch::Tensor& tokens) override {
    nn::AutocastGuard autocast(device_.type(), precision_.dtype, precision_.autocast);
    return inner_->next_logits(tokens).to(torch::kFloat);  // [B, vocab]
  }
  void reset() override { inner_->reset(); }
  int64_t vocabulary() const override { return inner_->vocabulary(); }

 private:
  std::unique_ptr<models::Decoder> inner_;
  torch::Device device_;
  Precision precision_;
};

}  // namespace

std::unique_ptr<models::Decoder> Trainer::decoder(bool use_cache) {
  const auto& make = models::model_registry().get(s_->loaded.cfg.model.name).decoder;
  if (!make) return nullptr;
  auto& p = s_->parts;
  p.model->eval();
  return std::make_unique<AutocastDecoder>(make(*p.model, use_cache), p.device, p.precision);
}

torch::Tensor Trainer::input_from_image(const std::vector<uint8_t>& bytes,
                                        const std::string& path) const {
  return s_->parts.splits.val->input_from_image(bytes, path);
}

const std::vector<std::string>& Trainer::class_names() const {
  return s_->parts.splits.spec.class_names;
}

torch::Tensor Trainer::predict(const torch::Tensor& inputs) {
  auto& p = s_->parts;
  torch::NoGradGuard no_grad;
  p.model->eval();
  torch::Tensor logits;  // [B, K]
  {
    nn::AutocastGuard autocast(p.device.type(), p.precision.dtype, p.precision.autocast);
    logits = p.model->forward(inputs.to(p.device));
  }
  logits = p.whole_outputs(logits);  // tensor parallelism: every rank's classes
  return read_to_host(logits.to(torch::kFloat).softmax(/*dim=*/1));
}

int64_t Trainer::step() const {
  return s_->state.step;
}

EvalResult Trainer::evaluate_train_split() {
  auto& p = s_->parts;
  const auto& cfg = s_->loaded.cfg;
  data::LoaderOptions o;
  o.batch_size = cfg.data.eval_batch_size > 0 ? cfg.data.eval_batch_size : cfg.data.batch_size;
  o.shuffle = false;
  o.drop_last = false;
  o.even = false;
  o.workers = cfg.data.workers;
  o.seed = static_cast<uint64_t>(cfg.seed);
  o.pin_memory = p.device.is_cuda();
  const distributed::Group* data = p.data_group();
  o.rank = data ? data->rank() : 0;
  o.world_size = data ? data->world_size() : 1;
  data::Loader loader(p.splits.train, o);
  Progress bar(s_->job.rank == 0 ? cfg.run.progress : "never");
  const auto r = engine::evaluate(
      p, loader, s_->state.bad_samples, /*max_batches=*/0,
      [&](int64_t done, int64_t total) { bar.evaluation("eval (train split)", done, total); });
  bar.clear();
  return r;
}

int64_t Trainer::forward_flops() {
  return engine::forward_flops(s_->parts, s_->loaded.cfg.data.batch_size);
}

int64_t Trainer::train_flops() {
  return train_step_flops(s_->parts, s_->loaded.cfg.data.batch_size);
}

int64_t Trainer::measure_step_memory(bool bf16, int64_t batch) {
  return step_peak(s_->parts, *s_->parts.model, bf16, batch);
}

MemoryEstimate Trainer::estimate_memory(bool bf16, const std::string& checkpointing,
                                        const std::string& base_quant) {
  auto model = s_->loaded.cfg.model;
  if (!base_quant.empty()) model.lora.base_quant = base_quant;
  return engine::estimate_memory(s_->parts, model, bf16, checkpointing);
}

}  // namespace trainer::engine
