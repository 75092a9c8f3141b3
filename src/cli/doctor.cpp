// trainer doctor: what is installed, what LibTorch sees, and what to fix.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cinttypes>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "config/loader.h"
#include "distributed/env.h"
#include "doctor/probe.h"
#include "engine/loop/trainer.h"
#include "engine/setup/components.h"
#include "models/model.h"
#include "util/format.h"
#include "util/strings.h"

namespace trainer::cli {
namespace {

// "sass", "ptx", "none", or "unknown" without an architecture list.
const char* kernel_image_name(const doctor::Gpu& g, const std::vector<std::string>& arch_list) {
  if (arch_list.empty()) return "unknown";
  switch (doctor::kernel_image(g.cc_major, g.cc_minor, arch_list)) {
    case doctor::KernelImage::sass:
      return "sass";
    case doctor::KernelImage::ptx:
      return "ptx";
    case doctor::KernelImage::none:
      break;
  }
  return "none";
}

nlohmann::json facts_json(const doctor::Facts& f) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& g : f.gpus) {
    gpus.push_back(
        {{"index", g.index},
         {"name", g.name},
         {"compute_capability", std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor)},
         {"memory_mb", g.total_mb},
         {"kernel_image", kernel_image_name(g, f.arch_list)}});
  }
  nlohmann::json libraries = nlohmann::json::array();
  for (const auto& lib : doctor::cuda_libraries(f.maps)) {
    libraries.push_back({{"family", lib.family}, {"path", lib.path}});
  }
  return {{"trainer_version", f.trainer_version},
          {"libtorch_version", f.libtorch_version},
          {"libtorch_cuda", f.torch_cuda},
          {"cuda_available", f.cuda_available},
          {"driver_version", f.driver_version},
          {"driver_cuda", f.driver_cuda ? doctor::cuda_text(f.driver_cuda) : ""},
          {"runtime_cuda", f.runtime_cuda ? doctor::cuda_text(f.runtime_cuda) : ""},
          {"cudnn_built", f.cudnn_built},
          {"cudnn_loaded", f.cudnn_loaded},
          {"nccl_version", f.nccl_version},
          {"arch_list", f.arch_list},
          {"gpus", gpus},
          {"libraries", libraries},
          {"env", f.env},
          {"shm_mb", f.shm_bytes >= 0 ? f.shm_bytes >> 20 : -1},
          {"cpu_cores", f.cpu_cores},
          {"memory_mb", f.memory_mb},
          {"container", f.container}};
}

// Bytes in the largest binary unit that keeps the figure at 1 or more: "512 B", "3.2 MiB",
// "139.8 GiB" (a small model's memory does not round to "0.0 GiB").
std::string bytes_text(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  auto value = static_cast<double>(bytes);
  size_t unit = 0;
  while (unit + 1 < std::size(units) && (value >= 1024.0 || value <= -1024.0)) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return strprintf("%" PRId64 " B", bytes);
  return strprintf("%.1f %s", value, units[unit]);
}

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

// --gpu-memory's text ("80GB", "141GiB", "81920MiB"; util/format.h's parse_size) in MiB;
// UsageError naming the flag otherwise.
int64_t gpu_memory_mb(const std::string& text) {
  const double mb = parse_size(text) / 1048576.0;
  if (!(mb >= 1) || mb > 1e9) {
    throw UsageError("--gpu-memory: expected a size such as 80GB, 141GiB or 24576MiB, got '" +
                     text + "'");
  }
  return static_cast<int64_t>(mb);
}

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

// What would make a step that needs too much fit in `usable` bytes, each with its estimate, in
// order: gradient accumulation, bfloat16, activation checkpointing, fsdp, more GPUs.
std::vector<std::string> memory_remedies(engine::Trainer& trainer,
                                         const engine::MemoryEstimate& planned,
                                         const engine::MemoryEstimate& bf16, bool use_bf16,
                                         int64_t usable) {
  const auto& cfg = trainer.config();
  const int64_t batch = cfg.data.batch_size;
  std::vector<std::string> remedies;
  for (int64_t split = 2; split <= batch; split *= 2) {
    if (planned.total(batch / split) <= usable) {
      remedies.push_back(strprintf(
          "data.batch_size %" PRId64 " with train.grad_accum_steps %" PRId64 ": %s", batch / split,
          cfg.train.grad_accum_steps * split, bytes_text(planned.total(batch / split)).c_str()));
      break;
    }
  }
  if (!use_bf16)
    remedies.push_back("amp.enabled with amp.dtype bfloat16: " + bytes_text(bf16.total(batch)));
  if (cfg.model.checkpointing == "none") {
    try {
      const auto e = trainer.estimate_memory(use_bf16, /*checkpointing=*/"blocks");
      remedies.push_back(
          "model.checkpointing blocks (recomputes each block in backward: one more forward per "
          "step): " +
          bytes_text(e.total(batch)));
    } catch (const models::ModelError&) {
      // A model without blocks.
    }
  }
  for (int64_t gpus = 2; gpus <= 64; gpus *= 2) {
    if (cfg.dist.strategy != "fsdp" && planned.fsdp_total(batch, gpus) <= usable) {
      remedies.push_back(strprintf(
          "dist.strategy fsdp on %" PRId64
          " GPUs (parameters, gradients and optimizer state sharded; trainer --nproc-per-node "
          "auto): %s per GPU",
          gpus, bytes_text(planned.fsdp_total(batch, gpus)).c_str()));
      break;
    }
  }
  for (int64_t gpus = 2; gpus <= 64; gpus *= 2) {
    if (planned.total(batch / gpus) <= usable) {
      remedies.push_back(strprintf("%" PRId64 " GPUs at data.batch_size %" PRId64 " each: %s", gpus,
                                   batch / gpus, bytes_text(planned.total(batch / gpus)).c_str()));
      break;
    }
  }
  return remedies;
}

// doctor --json's "memory" object.
nlohmann::json memory_json(const config::Config& cfg, const engine::MemoryEstimate& fp32,
                           const engine::MemoryEstimate& bf16,
                           const engine::MemoryEstimate& planned, const Capacity& capacity,
                           int64_t world, int64_t tp, bool fsdp, bool fits) {
  const int64_t batch = cfg.data.batch_size;
  return {{"model", cfg.model.name},
          {"strategy", fsdp ? "fsdp" : "ddp"},
          {"world_size", world},
          {"fsdp_bytes", planned.fsdp_total(batch, world)},
          {"tp_size", tp},
          {"tp_bytes", planned.tp_total(batch, tp, world, fsdp)},
          {"batch_per_process", batch},
          {"float32_bytes", fp32.total(batch)},
          {"bfloat16_bytes", bf16.total(batch)},
          {"params_bytes", fp32.params_bytes},
          {"optimizer_bytes", fp32.optimizer_bytes},
          {"float32_bytes_per_sample", fp32.step_bytes_per_sample},
          {"bfloat16_bytes_per_sample", bf16.step_bytes_per_sample},
          {"capacity_mb", capacity.mb},
          {"checkpointing", cfg.model.checkpointing},
          {"fits", fits}};
}

// The memory per process with tensor parallelism (tp > 1) or fsdp (when chosen, or when the step
// does not fit whole), as the memory finding's message adds it; "" otherwise.
std::string parallel_note(const engine::MemoryEstimate& planned, int64_t batch, int64_t world,
                          int64_t tp, bool fsdp, bool fits) {
  if (tp > 1) {
    return strprintf("; with dist.tp_size %" PRId64 " over %" PRId64 " processes (%" PRId64
                     " data-parallel%s) %s per process",
                     tp, world, std::max<int64_t>(world / tp, 1), fsdp ? ", fsdp" : "",
                     bytes_text(planned.tp_total(batch, tp, world, fsdp)).c_str());
  }
  if (!fsdp && fits) return "";
  return strprintf("; with dist.strategy fsdp on %" PRId64 " process%s %s per process", world,
                   world == 1 ? "" : "es", bytes_text(planned.fsdp_total(batch, world)).c_str());
}

// The memory a config's training step needs per process, against the device's capacity; the
// run is planned (its model on the meta device, engine::Build::plan) and its step counted on meta
// tensors (engine/measure/memory.h): nothing of the model's size is allocated.
// Where the job is planned for: --gpus and --gpu-memory, else the launcher's world size and the
// GPUs found.
struct Target {
  int64_t gpus = 0;    // 0: the job's world size (job_world_size)
  int64_t gpu_mb = 0;  // 0: the smallest device found
};

doctor::Finding memory_finding(const std::string& config_path, std::vector<std::string> sets,
                               const doctor::Facts& facts, const Target& target,
                               int64_t measure_batch, nlohmann::json& out) {
  sets.push_back("device=cpu");
  sets.push_back("data.workers=0");
  auto loaded = load_config(config_path, sets, {});
  // Measured whole in one process; fsdp's and tensor parallelism's figures follow from the
  // measurement.
  const bool fsdp = loaded.cfg.dist.strategy == "fsdp";
  const int64_t tp = loaded.cfg.dist.tp_size;
  loaded.cfg.dist.strategy = "ddp";
  loaded.cfg.dist.tp_size = 1;
  engine::Trainer trainer(loaded, {}, engine::Build::plan);  // no parameter allocated
  const auto& cfg = loaded.cfg;
  const auto fp32 = trainer.estimate_memory(/*bf16=*/false);
  const auto bf16 = trainer.estimate_memory(/*bf16=*/true);
  const int64_t batch = cfg.data.batch_size;
  const bool use_bf16 = cfg.amp.enabled && cfg.amp.dtype == "bfloat16";
  const auto& planned = use_bf16 ? bf16 : fp32;
  const Capacity capacity =
      target.gpu_mb > 0
          ? Capacity{target.gpu_mb,
                     "each GPU's " + bytes_text(target.gpu_mb << 20) + " (--gpu-memory)", true}
          : smallest_device(facts);
  // A tenth stays free for the CUDA context, library workspaces and fragmentation.
  const int64_t usable = (capacity.mb << 20) / 10 * 9;
  const int64_t world = target.gpus > 0 ? target.gpus : job_world_size(facts);
  const int64_t needed = tp > 1 ? planned.tp_total(batch, tp, world, fsdp)
                         : fsdp ? planned.fsdp_total(batch, world)
                                : planned.total(batch);
  const bool fits = needed <= usable;
  out = memory_json(cfg, fp32, bf16, planned, capacity, world, tp, fsdp, fits);
  const std::string checkpointing =
      cfg.model.checkpointing == "none"
          ? ""
          : " with activation checkpointing " + cfg.model.checkpointing;
  std::string message = strprintf(
      "%s%s at batch %" PRId64
      " per process: %s in float32 (parameters %s, optimizer %s, step %s), %s "
      "with bfloat16 autocast%s; %s",
      cfg.model.name.c_str(), checkpointing.c_str(), batch, bytes_text(fp32.total(batch)).c_str(),
      bytes_text(fp32.params_bytes).c_str(), bytes_text(fp32.optimizer_bytes).c_str(),
      bytes_text(fp32.total(batch) - fp32.params_bytes - fp32.optimizer_bytes).c_str(),
      bytes_text(bf16.total(batch)).c_str(), bf16_note(fp32, bf16, batch).c_str(),
      capacity.where.c_str());
  message += parallel_note(planned, batch, world, tp, fsdp, fits);
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
  const auto remedies = memory_remedies(trainer, planned, bf16, use_bf16, usable);
  return {capacity.gpu ? doctor::Level::fail : doctor::Level::warn, "memory",
          message + " (does not fit)", join(remedies, "; ")};
}

cxxopts::Options doctor_options() {
  cxxopts::Options options("trainer doctor",
                           "Checks the GPU environment: driver, CUDA, cuDNN, NCCL, LibTorch, "
                           "libraries, shared memory.");
  // clang-format off
  options.add_options()
      ("json", "print one JSON object instead of the report")
      ("config", "also check against this config: that it asks for a GPU, and the memory its "
       "training step needs per process (the step counted on the planned model at batches 2 and "
       "4, extrapolated; no parameter is allocated)",
       cxxopts::value<std::string>(), "FILE")
      ("gpus", "with --config: plan the job for N GPUs (its world size) instead of the launcher's "
       "world size or the GPUs found", cxxopts::value<int64_t>(), "N")
      ("gpu-memory", "with --config: each GPU's memory (80GB, 141GiB) instead of the smallest "
       "GPU found", cxxopts::value<std::string>(), "SIZE")
      ("measure-batch", "with --config: also count one step at this batch (JSON memory.measured)",
       cxxopts::value<int64_t>()->default_value("0"), "N")
      ("perf", "measure the server against its specification instead: matmul TFLOP/s, memory "
       "and PCIe bandwidth, collectives (under trainer launch), with --config the data read rate "
       "and whether the job is input-, compute- or communication-bound")
      ("quick", "with --perf: smaller sizes, fewer repeats (under 30 s on a GPU server)")
      ("set", "with --config: override a config key (repeatable)",
       cxxopts::value<std::vector<std::string>>(), "KEY.PATH=VALUE")
      ("h,help", "print this help");
  // clang-format on
  return options;
}

// The findings as the report's lines, or as JSON; returns the exit code.
int print_report(const std::vector<doctor::Finding>& findings, const doctor::Facts& facts,
                 const nlohmann::json& memory, bool json) {
  const int code = doctor::exit_code(findings);
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& f : findings) {
      list.push_back({{"level", doctor::level_name(f.level)},
                      {"check", f.check},
                      {"message", f.message},
                      {"fix", f.fix}});
    }
    nlohmann::json report = {{"exit_code", code}, {"findings", list}, {"facts", facts_json(facts)}};
    if (!memory.is_null()) report["memory"] = memory;
    std::cout << report.dump(2) << "\n";
    return code;
  }
  int counts[3] = {0, 0, 0};
  for (const auto& f : findings) {
    ++counts[static_cast<int>(f.level)];
    std::cout << strprintf("%-5s %-10s %s\n", doctor::level_name(f.level), f.check.c_str(),
                           f.message.c_str());
    if (!f.fix.empty()) std::cout << strprintf("%-16s fix: %s\n", "", f.fix.c_str());
  }
  std::cout << strprintf("%d OK, %d WARN, %d FAIL\n", counts[0], counts[1], counts[2]);
  return code;
}

}  // namespace

int doctor_command(int argc, char** argv) {
  auto options = doctor_options();
  const cxxopts::ParseResult args = parse_or_usage(options, argc, argv);
  if (args.count("help")) {
    std::cout << options.help() << "\nExit codes: 0 no FAIL finding, 1 at least one, 2 usage.\n";
    return 0;
  }
  const auto sets =
      args.count("set") ? args["set"].as<std::vector<std::string>>() : std::vector<std::string>{};
  if ((args.count("gpus") || args.count("gpu-memory")) && !args.count("config")) {
    throw UsageError("doctor: --gpus and --gpu-memory plan a config's job; give --config");
  }
  if (args.count("gpus") && args["gpus"].as<int64_t>() < 1) {
    throw UsageError("--gpus: expected a number of GPUs >= 1, got " +
                     std::to_string(args["gpus"].as<int64_t>()));
  }
  if (!sets.empty() && !args.count("config")) {
    throw UsageError("doctor: --set overrides keys of --config FILE; give --config");
  }
  if (args.count("perf")) {
    return doctor_perf(args.count("config") ? args["config"].as<std::string>() : "", sets,
                       args.count("quick") > 0, args.count("json") > 0);
  }
  bool wants_cuda = false;
  if (args.count("config")) {
    // Read without validating: a config asking for a GPU this machine lacks is what the doctor
    // reports, not a usage error.
    const auto loaded = engine::load_config(args["config"].as<std::string>(), sets);
    wants_cuda = loaded.cfg.device.rfind("cuda", 0) == 0;
  }
  const doctor::Facts facts = doctor::probe(wants_cuda);
  auto findings = doctor::check(facts);
  nlohmann::json memory;
  if (args.count("config")) {
    Target target;
    if (args.count("gpus")) target.gpus = args["gpus"].as<int64_t>();
    if (args.count("gpu-memory"))
      target.gpu_mb = gpu_memory_mb(args["gpu-memory"].as<std::string>());
    findings.push_back(memory_finding(args["config"].as<std::string>(), sets, facts, target,
                                      args["measure-batch"].as<int64_t>(), memory));
  }
  return print_report(findings, facts, memory, args.count("json") > 0);
}

}  // namespace trainer::cli
