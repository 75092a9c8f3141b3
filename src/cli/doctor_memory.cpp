#include "cli/doctor_memory.h"

#include <algorithm>
#include <cinttypes>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "config/loader.h"
#include "distributed/env.h"
#include "engine/loop/trainer.h"
#include "engine/measure/memory_plan.h"
#include "engine/setup/components.h"
#include "models/model.h"
#include "util/format.h"
#include "util/strings.h"

namespace trainer::cli {
namespace {

// Why bfloat16 autocast needs more than float32 at `batch`, when it does ("" otherwise). Autocast
// runs the loss (a softmax over the model's outputs) in float32: the outputs are held in bfloat16
// and again in float32, which for a large vocabulary outweighs what bfloat16 saves on the other
// activations; and it holds a bfloat16 copy of each weight while a step runs, a fixed cost that
// smaller activations pay back only from some batch on.
std::string bf16_note(const engine::MemoryEstimate& fp32, const engine::MemoryEstimate& bf16,
                      int64_t batch) {
  if (bf16.total(batch) <= fp32.total(batch)) return "";
  const int64_t per_sample = bf16.step_bytes_per_sample,
                fp32_per_sample = fp32.step_bytes_per_sample;
  if (per_sample >= fp32_per_sample) {
    return " (more than float32: " + bytes_text(per_sample) + " a sample against " +
           bytes_text(fp32_per_sample) +
           ", as autocast computes the loss in float32, holding the model's outputs in bfloat16 "
           "and again in float32; with a large vocabulary they outweigh what bfloat16 saves on "
           "the other activations)";
  }
  const int64_t fixed = bf16.total(0) - fp32.total(0);
  const int64_t saved = fp32_per_sample - per_sample;
  const int64_t from = (fixed + saved - 1) / saved;  // the first batch where bfloat16 needs less
  return strprintf(
      " (more than float32 at this batch: autocast holds bfloat16 copies of the "
      "weights while a step runs, %s more before any sample; it saves %s a sample, "
      "so it needs less from batch %" PRId64 " on)",
      bytes_text(fixed).c_str(), bytes_text(saved).c_str(), from);
}

// Where a step's memory must fit: the smallest GPU, or the machine's memory when there is none.
struct Capacity {
  int64_t mb = 0;
  std::string where;  // e.g. "GPU 0's 139.8 GiB"
  bool gpu = false;
};

Capacity smallest_device(const doctor::Facts& facts) {
  Capacity c{facts.memory_mb, "the machine's " + bytes_text(facts.memory_mb << 20) + " of memory",
             false};
  for (const auto& g : facts.gpus) {
    if (!c.gpu || g.total_mb < c.mb)
      c = {g.total_mb, "GPU " + std::to_string(g.index) + "'s " + bytes_text(g.total_mb << 20),
           true};
  }
  return c;
}

// The processes of the job the doctor checks for: the launcher's world size (torchrun, SLURM,
// Open MPI variables), else one per GPU.
int64_t job_world_size(const doctor::Facts& facts) {
  const distributed::DistEnv job = distributed::read_process_env();
  if (job.launched()) return job.world_size;
  return std::max<int64_t>(static_cast<int64_t>(facts.gpus.size()), 1);
}

// What is planned: the run, its estimate in the dtype it trains in, and the job's layout.
struct Planned {
  engine::Trainer& trainer;
  const config::Config& cfg;
  bool bf16 = false;
  engine::JobLayout job;
  int64_t usable = 0;  // bytes a process may take

  // DPO without LoRA: the reference is a frozen copy of the starting weights (with LoRA, the base
  // with the adapters off: no copy).
  bool reference_copy() const { return cfg.train.objective == "dpo" && !cfg.model.lora.enabled(); }
  engine::MemoryEstimate with_reference(engine::MemoryEstimate e) const {
    if (reference_copy()) e.reference_bytes = e.params_bytes;
    return e;
  }
  int64_t per_process(const engine::MemoryEstimate& e, const engine::JobLayout& layout) const {
    return engine::plan_memory(with_reference(e), layout).total();
  }
};

// A remedy's line: the change and the plan's new figure per process.
std::string remedy(const std::string& change, int64_t bytes) {
  return change + ": " + bytes_text(bytes) + " per process";
}

// Changes of the model's memory (bfloat16, recomputed blocks, a quantized base) that make the
// step fit, each with its figure.
void model_remedies(const Planned& p, const engine::MemoryEstimate& bf16,
                    std::vector<std::string>& out) {
  const auto& cfg = p.cfg;
  if (!p.bf16) {
    out.push_back(remedy("amp.enabled with amp.dtype bfloat16", p.per_process(bf16, p.job)));
  }
  if (cfg.model.checkpointing == "none") {
    try {
      out.push_back(
          remedy("model.checkpointing blocks (recomputes each block in backward: one "
                 "more forward per step)",
                 p.per_process(p.trainer.estimate_memory(p.bf16, "blocks"), p.job)));
    } catch (const models::ModelError&) {
      // A model without blocks.
    }
  }
  if (p.job.gpu && cfg.model.checkpointing != "offload") {
    try {
      out.push_back(
          remedy("model.checkpointing offload (each block recomputed, its input held "
                 "in host memory from forward to backward)",
                 p.per_process(p.trainer.estimate_memory(p.bf16, "offload"), p.job)));
    } catch (const models::ModelError&) {
    }
  }
  if (cfg.model.lora.enabled() && cfg.model.lora.base_quant == "none") {
    out.push_back(
        remedy("model.lora.base_quant nf4 (the frozen base's linear layers in 4 bits, "
               "QLoRA)",
               p.per_process(p.trainer.estimate_memory(p.bf16, "", "nf4"), p.job)));
  }
}

// What would make a step that needs too much fit in p.usable bytes, each with its figure, in
// order: a smaller micro-batch with more accumulation, the model's changes, fsdp on more GPUs,
// more GPUs.
std::vector<std::string> memory_remedies(const Planned& p, const engine::MemoryEstimate& e,
                                         const engine::MemoryEstimate& bf16) {
  const auto& cfg = p.cfg;
  const int64_t batch = p.job.batch;
  std::vector<std::string> remedies;
  for (int64_t split = 2; split <= batch; split *= 2) {
    auto job = p.job;
    job.batch = batch / split;
    if (p.per_process(e, job) <= p.usable) {
      remedies.push_back(
          remedy(strprintf("data.batch_size %" PRId64 " with train.grad_accum_steps %" PRId64,
                           job.batch, cfg.train.grad_accum_steps * split),
                 p.per_process(e, job)));
      break;
    }
  }
  model_remedies(p, bf16, remedies);
  for (int64_t gpus = std::max<int64_t>(2, p.job.world); gpus <= 1024; gpus *= 2) {
    auto job = p.job;
    job.world = gpus;
    job.fsdp = true;
    if ((!p.job.fsdp || gpus > p.job.world) && p.per_process(e, job) <= p.usable) {
      remedies.push_back(remedy(strprintf("dist.strategy fsdp on %" PRId64
                                          " GPUs (parameters, gradients and optimizer state "
                                          "sharded; trainer launch --nproc-per-node auto)",
                                          gpus),
                                p.per_process(e, job)));
      break;
    }
  }
  for (int64_t gpus = 2; gpus <= 64 && gpus <= batch; gpus *= 2) {
    auto job = p.job;
    job.batch = batch / gpus;
    job.world = p.job.world * gpus;
    if (p.per_process(e, job) <= p.usable) {
      remedies.push_back(
          remedy(strprintf("%" PRId64 " times the GPUs at data.batch_size %" PRId64 " each", gpus,
                           job.batch),
                 p.per_process(e, job)));
      break;
    }
  }
  return remedies;
}

nlohmann::json plan_json(const engine::MemoryPlan& plan, const engine::JobLayout& job,
                         int64_t usable, bool fits) {
  nlohmann::json parts = nlohmann::json::object();
  for (const auto& part : plan.parts) parts[part.name] = part.bytes;
  return {{"per_process_bytes", plan.total()},
          {"parts", parts},
          {"usable_bytes", usable},
          {"processes", job.world},
          {"gpu", job.gpu},
          {"fits", fits}};
}

// doctor --json's "memory" object.
nlohmann::json memory_json(const Planned& p, const engine::MemoryEstimate& fp32,
                           const engine::MemoryEstimate& bf16, const engine::MemoryEstimate& e,
                           const Capacity& capacity, bool fits) {
  const auto& cfg = p.cfg;
  const int64_t batch = p.job.batch;
  auto cpu_job = p.job;  // the layouts' figures without the GPU's own parts
  cpu_job.gpu = false;
  auto fsdp_job = cpu_job, tp_job = cpu_job;
  fsdp_job.fsdp = true;
  fsdp_job.tp = 1;
  return {{"model", cfg.model.name},
          {"strategy", p.job.fsdp ? "fsdp" : "ddp"},
          {"world_size", p.job.world},
          {"fsdp_bytes", p.per_process(e, fsdp_job)},
          {"tp_size", p.job.tp},
          {"tp_bytes", p.per_process(e, tp_job)},
          {"batch_per_process", batch},
          {"float32_bytes", fp32.total(batch)},
          {"bfloat16_bytes", bf16.total(batch)},
          {"params_bytes", fp32.params_bytes},
          {"optimizer_bytes", fp32.optimizer_bytes},
          {"float32_bytes_per_sample", fp32.step_bytes_per_sample},
          {"bfloat16_bytes_per_sample", bf16.step_bytes_per_sample},
          {"capacity_mb", capacity.mb},
          {"checkpointing", cfg.model.checkpointing},
          {"plan", plan_json(engine::plan_memory(e, p.job), p.job, p.usable, fits)},
          {"fits", fits}};
}

// "per process of 8 with dist.strategy fsdp and dist.tp_size 2": the job the plan is for.
std::string job_text(const engine::JobLayout& job) {
  std::string text =
      job.world == 1 ? "one process" : strprintf("per process of %" PRId64, job.world);
  if (job.fsdp) text += " with dist.strategy fsdp";
  if (job.tp > 1)
    text += strprintf("%s dist.tp_size %" PRId64, job.fsdp ? " and" : " with", job.tp);
  return text;
}

}  // namespace

int64_t gpu_memory_mb(const std::string& text) {
  const double mb = parse_size(text) / 1048576.0;
  if (!(mb >= 1) || mb > 1e9) {
    throw UsageError("--gpu-memory: expected a size such as 80GB, 141GiB or 24576MiB, got '" +
                     text + "'");
  }
  return static_cast<int64_t>(mb);
}

doctor::Finding memory_finding(const std::string& config_path, std::vector<std::string> sets,
                               const doctor::Facts& facts, const MemoryTarget& target,
                               int64_t measure_batch, nlohmann::json& out) {
  sets.push_back("device=cpu");
  sets.push_back("data.workers=0");
  auto loaded = load_config(config_path, sets, {});
  // Measured whole in one process; the layouts' figures follow from the measurement.
  const bool fsdp = loaded.cfg.dist.strategy == "fsdp";
  const int64_t tp = loaded.cfg.dist.tp_size;
  loaded.cfg.dist.strategy = "ddp";
  loaded.cfg.dist.tp_size = 1;
  engine::Trainer trainer(loaded, {}, engine::Build::plan);  // no parameter allocated
  const auto& cfg = loaded.cfg;
  const int64_t batch = cfg.data.batch_size;
  const bool use_bf16 = cfg.amp.enabled && cfg.amp.dtype == "bfloat16";
  Planned p{trainer, cfg, use_bf16, {}, 0};
  const auto fp32 = p.with_reference(trainer.estimate_memory(/*bf16=*/false));
  const auto bf16 = p.with_reference(trainer.estimate_memory(/*bf16=*/true));
  const auto& e = use_bf16 ? bf16 : fp32;
  const Capacity capacity =
      target.gpu_mb > 0
          ? Capacity{target.gpu_mb,
                     "each GPU's " + bytes_text(target.gpu_mb << 20) + " (--gpu-memory)", true}
          : smallest_device(facts);
  const bool gpu = target.gpu_job || capacity.gpu;
  p.job = {batch, target.gpus > 0 ? target.gpus : job_world_size(facts), tp, fsdp, gpu};
  // On a GPU the plan counts the context, NCCL and fragmentation; the machine's memory keeps a
  // tenth for the rest of the system.
  p.usable = gpu ? capacity.mb << 20 : (capacity.mb << 20) / 10 * 9;
  const auto plan = engine::plan_memory(e, p.job);
  const bool fits = plan.total() <= p.usable;
  out = memory_json(p, fp32, bf16, e, capacity, fits);
  const std::string checkpointing =
      cfg.model.checkpointing == "none"
          ? ""
          : " with activation checkpointing " + cfg.model.checkpointing;
  std::string message = strprintf(
      "%s%s at batch %" PRId64
      " per process: %s in float32 (parameters %s, optimizer %s, step %s), %s "
      "with bfloat16 autocast%s; %s %s: %s against %s",
      cfg.model.name.c_str(), checkpointing.c_str(), batch, bytes_text(fp32.total(batch)).c_str(),
      bytes_text(fp32.params_bytes).c_str(), bytes_text(fp32.optimizer_bytes).c_str(),
      bytes_text(fp32.total(batch) - fp32.params_bytes - fp32.optimizer_bytes).c_str(),
      bytes_text(bf16.total(batch)).c_str(), bf16_note(fp32, bf16, batch).c_str(),
      gpu ? "planned on GPUs," : "planned", job_text(p.job).c_str(),
      engine::plan_text(plan).c_str(), capacity.where.c_str());
  if (measure_batch > 0) {
    // One real step at that batch, to check the extrapolation against.
    const int64_t fixed = fp32.params_bytes + fp32.optimizer_bytes;
    out["measured"] = {{"batch", measure_batch},
                       {"float32_bytes", fixed + trainer.measure_step_memory(false, measure_batch)},
                       {"bfloat16_bytes", fixed + trainer.measure_step_memory(true, measure_batch)},
                       {"float32_estimate_bytes", fp32.total(measure_batch)},
                       {"bfloat16_estimate_bytes", bf16.total(measure_batch)}};
  }
  if (fits) return {doctor::Level::ok, "memory", message + " (fits)", ""};
  return {capacity.gpu ? doctor::Level::fail : doctor::Level::warn, "memory",
          message + " (does not fit)", join(memory_remedies(p, e, bf16), "; ")};
}

}  // namespace trainer::cli
