// Range checks of each section's own keys. Checks that span sections or depend on the machine
// are in validate.cpp's validate(); each registered entry checks its own keys in its file.
#include "config/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "util/format.h"
#include "util/strings.h"

namespace trainer::config {
namespace {

// Every entry of `v` must be > 0.
void each_positive(Checks& c, const std::string& key, const std::vector<double>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!(v[i] > 0.0)) {
      c.add(key, "every entry must be > 0, got " + format_number(v[i]) + " at item " +
                     std::to_string(i + 1));
    }
  }
}

}  // namespace

std::optional<int64_t> checkpoint_period(const std::string& spec) {
  if (spec == "none") return 0;
  if (spec == "blocks" || spec == "offload") return 1;  // offload: blocks, inputs on the host
  if (spec.rfind("every:", 0) != 0 || spec.size() == 6) return std::nullopt;
  const std::string digits = spec.substr(6);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  errno = 0;
  const long long n = std::strtoll(digits.c_str(), nullptr, 10);
  if (errno == ERANGE || n < 1) return std::nullopt;
  return static_cast<int64_t>(n);
}

void RunConfig::validate(Checks& c) const {
  c.at_least("log_every", log_every, 1);
  c.at_least("eval_every", eval_every, 0);
  c.at_least("eval_batches", eval_batches, 0);
  c.at_least("checkpoint_every", checkpoint_every, 0);
  c.at_least("keep_last", keep_last, 1);
  if (!keep_best.empty()) c.one_of("keep_best", keep_best, {"top1", "top5", "loss", "ppl"});
  c.at_least("threads", threads, 0);
  c.one_of("progress", progress, {"auto", "always", "never"});
}

void ModelConfig::validate(Checks& c) const {
  c.at_least("num_classes", num_classes, 0);
  if (!checkpoint_period(checkpointing)) {
    c.add("checkpointing",
          "must be none, blocks, offload or every:N with N >= 1, got '" + checkpointing + "'");
  }
}

void LoraConfig::validate(Checks& c) const {
  c.at_least("rank", rank, 0);
  const LoraConfig off;
  const bool set = alpha != off.alpha || dropout != off.dropout || !targets.empty() ||
                   rslora != off.rslora || base_dtype != off.base_dtype;
  if (rank == 0 && set) {
    c.add("rank",
          "is 0, which turns LoRA off, but other model.lora keys are set; give "
          "model.lora.rank > 0 (8 to 64) to train adapters, or leave model.lora out to "
          "train every weight");
  }
  if (!(alpha > 0.0 && alpha < 1e300)) {
    c.add("alpha", "must be a positive number (PEFT's lora_alpha), got " + format_number(alpha));
  }
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    c.add("dropout", "must be in [0, 1), got " + format_number(dropout));
  }
  if (targets.size() > 1 && std::count(targets.begin(), targets.end(), "all-linear")) {
    c.add("targets",
          "all-linear (PEFT's shorthand: every linear layer but the output layer) stands alone; "
          "give it alone, or name the layers without it");
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i].empty() || targets[i].find('.') != std::string::npos) {
      c.add("targets", "every entry must be a module name's last part (q_proj, c_attn), got '" +
                           targets[i] + "' at item " + std::to_string(i + 1));
    }
  }
  c.one_of("base_dtype", base_dtype, {"float32", "bfloat16", "float16"});
  c.one_of("base_quant", base_quant, {"none", "nf4", "int8"});
  if (rank == 0 && base_quant != off.base_quant) {
    c.add("base_quant",
          "quantizes the frozen base under LoRA adapters (QLoRA), but model.lora.rank is 0; set "
          "model.lora.rank (8 to 64), or base_quant: none");
  }
}

void DataSetKeys::validate(Checks& c) const {
  c.one_of("on_error", on_error, {"skip", "fail"});
  if (!mean.empty() && mean.size() != 1 && mean.size() != 3) {
    c.add("mean", "must have 1 or 3 entries (one per channel), got " + std::to_string(mean.size()));
  }
  if (stdev.size() != mean.size()) {
    c.add("std", "must have as many entries as data.mean (" + std::to_string(mean.size()) +
                     "), got " + std::to_string(stdev.size()));
  }
  each_positive(c, "std", stdev);
}

void MixPart::validate(Checks& c) const {
  DataSetKeys::validate(c);
  if (name.empty()) c.add("name", "name the data set of this part of data.mix");
  if (!(weight > 0.0 && weight < 1e300)) {
    c.add("weight", "must be a positive number, got " + format_number(weight));
  }
}

void DataConfig::validate(Checks& c) const {
  DataSetKeys::validate(c);
  c.at_least("batch_size", batch_size, 1);
  c.at_least("eval_batch_size", eval_batch_size, 0);
  c.at_least("workers", workers, 0);
  c.at_least("prefetch", prefetch, 1);
  c.at_least("throttle_ms", throttle_ms, 0);
}

void TrainConfig::validate(Checks& c) const {
  if (max_steps <= 0 && epochs < 1) {
    c.add("epochs", "must be >= 1 (or set train.max_steps > 0), got " + std::to_string(epochs));
  }
  c.at_least("max_steps", max_steps, 0);
  c.at_least("stop_at_step", stop_at_step, 0);
  if (!(stop_at_top1 >= 0.0 && stop_at_top1 <= 1.0)) {
    c.add("stop_at_top1",
          "must be a fraction in [0, 1] (0 = off), got " + format_number(stop_at_top1));
  }
  if (stop_at.metric.rfind("val_ema/", 0) == 0 && !ema.enabled()) {
    c.add("stop_at.metric", "is '" + stop_at.metric +
                                "', a metric of train.ema's average, but train.ema.decay is 0; "
                                "set train.ema.decay or use val/...");
  }
  c.at_least("grad_accum_steps", grad_accum_steps, 1);
  c.at_least("clip_grad_norm", clip_grad_norm, 0.0);
  c.at_least("max_bad_steps", max_bad_steps, 0);
  c.at_least("max_rollbacks", max_rollbacks, 1);
  c.fraction("label_smoothing", label_smoothing);
  if (rollback_on_nan && max_bad_steps == 0) {
    c.add("rollback_on_nan",
          "acts on the steps that train.max_bad_steps's check finds inf/NaN, which 0 turns off; "
          "set train.max_bad_steps >= 1");
  }
}

void StopAtConfig::validate(Checks& c) const {
  const bool has_below = !std::isnan(below), has_above = !std::isnan(above);
  if (metric.empty()) {
    if (has_below || has_above) {
      c.add("metric", "is not set, but train.stop_at." +
                          std::string(has_below ? "below" : "above") +
                          " is; name the metric, e.g. stop_at: {metric: val/loss, below: 0.925}");
    }
    return;
  }
  std::vector<std::string> known;
  for (const char* split : {"val/", "val_ema/"}) {
    for (const char* name : {"loss", "ppl", "top1", "top5"}) {
      known.push_back(split + std::string(name));
    }
  }
  c.one_of("metric", metric, known);
  if (has_below == has_above) {
    c.add(has_below ? "above" : "below",
          has_below ? "cannot be set with train.stop_at.below; keep one target"
                    : "is not set: give the target as train.stop_at.below (a loss) or .above "
                      "(an accuracy)");
  }
  if (std::isinf(below)) c.add("below", "must be a finite number, got " + format_number(below));
  if (std::isinf(above)) c.add("above", "must be a finite number, got " + format_number(above));
}

void EmaConfig::validate(Checks& c) const {
  if (!(decay >= 0.0 && decay < 1.0)) {
    c.add("decay",
          "must be in [0, 1) (0 = no average; timm's default 0.9998), got " + format_number(decay));
  }
  c.at_least("every", every, 1);
}

void ZScoreConfig::validate(Checks& c) const {
  c.at_least("loss", loss, 0.0);
  c.at_least("grad_norm", grad_norm, 0.0);
  c.at_least("window", window, 2);
}

void OptimConfig::validate(Checks& c) const {
  c.one_of("impl", impl, {"auto", "fused", "foreach", "loop"});
  c.at_least("lr", lr, 0.0);  // 0: frozen weights (evaluation, a warm-up of statistics)
  c.at_least("weight_decay", weight_decay, 0.0);
}

void SchedConfig::validate(Checks& c) const {
  c.at_least("warmup_steps", warmup_steps, 0);
  c.at_least("warmup_epochs", warmup_epochs, 0.0);
  if (warmup_epochs > 0.0 && warmup_steps > 0) {
    c.add("warmup_epochs", "set either sched.warmup_steps or sched.warmup_epochs, not both");
  }
  if (!(warmup_start_factor >= 0.0 && warmup_start_factor <= 1.0)) {
    c.add("warmup_start_factor", "must be in [0, 1], got " + format_number(warmup_start_factor));
  }
  c.at_least("step_size", step_size, 1);
  for (size_t i = 0; i < milestones.size(); ++i) {
    const int64_t m = milestones[i];
    const std::string item = " at item " + std::to_string(i + 1);
    if (m < 1) {
      c.add("milestones", "every milestone must be >= 1, got " + std::to_string(m) + item);
    } else if (i > 0 && m <= milestones[i - 1]) {
      c.add("milestones", "must be strictly increasing, got " + std::to_string(m) + " after " +
                              std::to_string(milestones[i - 1]) + item);
    }
  }
  if (!(gamma > 0.0 && gamma <= 1.0))
    c.add("gamma", "must be in (0, 1], got " + format_number(gamma));
  c.at_least("min_lr", min_lr, 0.0);
}

void AmpConfig::validate(Checks& c) const {
  c.one_of("dtype", dtype, {"float16", "bfloat16"});
  c.one_of("scaler", scaler, {"auto", "on", "off"});
  c.above("init_scale", init_scale, 0.0);
  if (!(growth_factor > 1.0))
    c.add("growth_factor", "must be > 1, got " + format_number(growth_factor));
  if (!(backoff_factor > 0.0 && backoff_factor < 1.0)) {
    c.add("backoff_factor", "must be in (0, 1), got " + format_number(backoff_factor));
  }
  c.at_least("growth_interval", growth_interval, 1);
}

void DistConfig::validate(Checks& c) const {
  c.one_of("strategy", strategy, {"ddp", "fsdp"});
  c.at_least("tp_size", tp_size, 1);
  c.one_of("backend", backend, {"auto", "nccl", "gloo"});
  c.one_of("fsdp_param_dtype", fsdp_param_dtype, {"auto", "float32", "bfloat16", "float16"});
  c.one_of("fsdp_reduce_dtype", fsdp_reduce_dtype, {"float32", "bfloat16", "float16"});
  c.above("bucket_cap_mb", bucket_cap_mb, 0.0);
  c.above("first_bucket_mb", first_bucket_mb, 0.0);
  c.above("init_timeout_s", init_timeout_s, 0.0);
  c.above("timeout_s", timeout_s, 0.0);
}

void TrackingConfig::validate(Checks& /*c*/) const {}

void ProfileConfig::validate(Checks& c) const {
  c.at_least("start_step", start_step, 0);
  c.at_least("steps", steps, 1);
  c.at_least("memory_snapshot_step", memory_snapshot_step, 0);
  if (memory_snapshot_step > 0 && !memory_snapshot) {
    c.add("memory_snapshot_step",
          "needs profile.memory_snapshot: true (the allocator's history "
          "is recorded from the start); set it, or 0");
  }
}

void LaunchConfig::validate(Checks& c) const {
  if (nproc_per_node == "auto") return;
  const bool digits = !nproc_per_node.empty() && nproc_per_node.size() <= 4 &&
                      nproc_per_node.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || std::stoi(nproc_per_node) < 1) {
    c.add("nproc_per_node",
          "must be a number of processes >= 1 or auto, got '" + nproc_per_node + "'");
  }
}

}  // namespace trainer::config
