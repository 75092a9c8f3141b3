// trainer doctor: what is installed, what LibTorch sees, and what to fix.
#include <nlohmann/json.hpp>

#include <cinttypes>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/doctor_memory.h"
#include "cli/options.h"
#include "config/loader.h"
#include "doctor/probe.h"
#include "engine/setup/components.h"
#include "util/format.h"

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
    MemoryTarget target;
    if (args.count("gpus")) target.gpus = args["gpus"].as<int64_t>();
    if (args.count("gpu-memory"))
      target.gpu_mb = gpu_memory_mb(args["gpu-memory"].as<std::string>());
    target.gpu_job = wants_cuda || target.gpu_mb > 0;
    findings.push_back(memory_finding(args["config"].as<std::string>(), sets, facts, target,
                                      args["measure-batch"].as<int64_t>(), memory));
  }
  return print_report(findings, facts, memory, args.count("json") > 0);
}

}  // namespace trainer::cli
