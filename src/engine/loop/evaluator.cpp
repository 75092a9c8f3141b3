#include "engine/loop/evaluator.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "engine/setup/objective.h"
#include "nn/autocast.h"
#include "util/device.h"

namespace trainer::engine {

EvalResult evaluate(Components& parts, int64_t& bad_samples, int64_t max_batches,
                    const EvalProgress& progress) {
  return evaluate(parts, *parts.val_loader, bad_samples, max_batches, progress);
}

namespace {

// With fsdp every forward gathers blocks from every rank: the batches this rank lacks against the
// rank with the most, run on a placeholder and discarded.
int64_t missing_forwards(Components& parts, int64_t mine) {
  distributed::Group* data = parts.data_group();
  if (!parts.fsdp || !data) return 0;
  auto most = torch::full({1}, mine, torch::dtype(torch::kLong).device(data->device()));
  data->all_reduce({most}, distributed::Reduce::max);
  return host_int(most) - mine;
}

// `count` forwards of a placeholder sample, so that this rank joins every gather of the ranks
// with more validation batches (fsdp).
void placeholder_forwards(Components& parts, int64_t count) {
  if (count <= 0) return;
  const auto& spec = parts.splits.spec;
  std::vector<int64_t> shape{1};
  shape.insert(shape.end(), spec.sample_shape.begin(), spec.sample_shape.end());
  const auto placeholder =
      torch::zeros(shape, torch::TensorOptions()
                              .device(parts.device)
                              .dtype(spec.sequence ? torch::kLong : torch::kFloat));
  nn::AutocastGuard autocast(parts.device.type(), parts.precision.dtype, parts.precision.autocast);
  for (; count > 0; --count) parts.model->forward(placeholder);
}

// The model's logits of `batch` under autocast, every rank's classes under tensor parallelism:
// [B, K] or [B, T, K]. Packed rows (data.pack) with their positions.
torch::Tensor batch_logits(Components& parts, const data::Batch& batch) {
  const auto& device = parts.device;
  auto inputs = batch.inputs.to(device, /*non_blocking=*/true);  // [B, ...]
  // [B, T] or undefined
  const auto positions = batch.positions.defined()
                             ? batch.positions.to(device, /*non_blocking=*/true)
                             : torch::Tensor();
  torch::Tensor logits;
  {
    nn::AutocastGuard autocast(device.type(), parts.precision.dtype, parts.precision.autocast);
    logits = parts.model->forward_packed(inputs, positions);
  }
  return parts.whole_outputs(logits);
}

// train.objective's evaluation (dpo): its loss and metrics of each batch of this rank's shard, as
// TRL's evaluate() logs them (the metrics' means over the batches, the loss weighted by their
// items), combined over the ranks at the end. The model is in eval mode.
EvalResult evaluate_objective(Components& parts, data::Loader& loader, int64_t batches,
                              int64_t& bad_samples, const EvalProgress& progress) {
  const auto& device = parts.device;
  loader.start_epoch(0);  // this rank's shard
  for (int64_t read = 0; read < batches; ++read) {
    auto batch = loader.next();
    if (!batch) break;
    bad_samples += batch->bad_samples;
    const auto inputs = batch->inputs.to(device, /*non_blocking=*/true);
    const auto targets = batch->targets.to(device, /*non_blocking=*/true);
    {
      nn::AutocastGuard autocast(device.type(), parts.precision.dtype, parts.precision.autocast);
      parts.objective->eval_loss(*parts.model, inputs, targets);
    }
    if (progress) progress(read + 1, batches);
  }
  const auto window = parts.objective->take_eval_window(parts.data_group());
  EvalResult r;
  r.loss = window.loss;
  r.samples = window.items;
  r.objective = window.metrics;
  return r;
}

}  // namespace

EvalResult evaluate(Components& parts, data::Loader& loader, int64_t& bad_samples,
                    int64_t max_batches, const EvalProgress& progress) {
  torch::NoGradGuard no_grad;
  const int64_t all = loader.batches_per_epoch();
  const int64_t batches = max_batches > 0 ? std::min(max_batches, all) : all;  // this rank's
  if (parts.objective) {  // alone or under ddp (validate.cpp)
    parts.model->eval();
    auto r = evaluate_objective(parts, loader, batches, bad_samples, progress);
    parts.model->train();
    return r;
  }
  if (parts.fsdp) parts.fsdp->gather_root();
  const int64_t extra = missing_forwards(parts, batches);
  auto& model = *parts.model;
  model.eval();
  const auto& device = parts.device;
  auto zero = [&] {
    return torch::zeros({}, torch::TensorOptions().device(device).dtype(torch::kDouble));
  };
  // Sums over predictions: one per sample, or one per token for sequences.
  torch::Tensor loss_sum = zero(), top1 = zero(), top5 = zero(), predictions = zero();
  loader.start_epoch(0);  // this rank's shard
  for (int64_t read = 0; read < batches; ++read) {
    auto batch = loader.next();
    if (!batch) break;
    bad_samples += batch->bad_samples;
    // [N] with N = B, or B * T for sequences
    auto targets = batch->targets.to(device, /*non_blocking=*/true).flatten();
    auto logits = batch_logits(parts, *batch);  // [B, K] or [B, T, K]
    logits = logits.to(torch::kFloat).reshape({targets.size(0), logits.size(-1)});  // [N, K]
    loss_sum += torch::nn::functional::cross_entropy(
        logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    const int64_t k = std::min<int64_t>(5, logits.size(1));
    auto topk = std::get<1>(logits.topk(k, /*dim=*/1));  // [N, k]
    auto hit = topk.eq(targets.unsqueeze(1));  // [N, k]; an ignored target (-100) hits none
    top1 += hit.select(/*dim=*/1, /*index=*/0).sum();
    top5 += hit.any(/*dim=*/1).sum();
    predictions +=
        targets.ne(data::kIgnoreTarget).sum();  // cross_entropy leaves the ignored out too
    if (progress) progress(read + 1, batches);
  }
  placeholder_forwards(parts, extra);
  if (parts.fsdp) parts.fsdp->release_root();
  model.train();
  auto sums = torch::stack({loss_sum, top1, top5, predictions});
  // Sums over every rank's shard (once per tensor-parallel group).
  if (auto* data = parts.data_group()) data->all_reduce({sums}, distributed::Reduce::sum);
  const auto host = read_to_host(sums);
  const auto s = host.accessor<double, 1>();
  EvalResult r;
  r.samples = static_cast<int64_t>(s[3]);
  r.sequence = parts.splits.spec.sequence;
  if (r.samples > 0) {
    const double n = static_cast<double>(r.samples);
    r.loss = s[0] / n;
    r.top1 = s[1] / n;
    r.top5 = s[2] / n;
    r.ppl = std::exp(r.loss);
  }
  return r;
}

}  // namespace trainer::engine
