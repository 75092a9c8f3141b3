// trainer doctor: what is installed, what LibTorch sees, and what to fix.
#include <nlohmann/json.hpp>

#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "config/loader.h"
#include "doctor/probe.h"
#include "util/format.h"

namespace trainer::cli {
namespace {

nlohmann::json facts_json(const doctor::Facts& f) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& g : f.gpus) {
    gpus.push_back(
        {{"index", g.index},
         {"name", g.name},
         {"compute_capability", std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor)},
         {"memory_mb", g.total_mb},
         {"kernel_image",
          f.arch_list.empty() ? "unknown"
          : doctor::kernel_image(g.cc_major, g.cc_minor, f.arch_list) == doctor::KernelImage::sass
              ? "sass"
          : doctor::kernel_image(g.cc_major, g.cc_minor, f.arch_list) == doctor::KernelImage::ptx
              ? "ptx"
              : "none"}});
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

}  // namespace

int doctor_command(int argc, char** argv) {
  cxxopts::Options options("trainer doctor",
                           "Checks the GPU environment: driver, CUDA, cuDNN, NCCL, LibTorch, "
                           "libraries, shared memory.");
  // clang-format off
  options.add_options()
      ("json", "print one JSON object instead of the report")
      ("config", "also check against this config (e.g. that it asks for a GPU)",
       cxxopts::value<std::string>(), "FILE")
      ("h,help", "print this help");
  // clang-format on
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(e.what());
  }
  if (args.count("help")) {
    std::cout << options.help() << "\nExit codes: 0 no FAIL finding, 1 at least one, 2 usage.\n";
    return 0;
  }
  if (!args.unmatched().empty()) {
    throw UsageError("unexpected argument '" + args.unmatched().front() + "'");
  }
  bool wants_cuda = false;
  if (args.count("config")) {
    // Read without validating: a config asking for a GPU this machine lacks is what the doctor
    // reports, not a usage error.
    const auto loaded = config::load(args["config"].as<std::string>(), {});
    wants_cuda = loaded.cfg.device.rfind("cuda", 0) == 0;
  }
  const doctor::Facts facts = doctor::probe(wants_cuda);
  const auto findings = doctor::check(facts);
  const int code = doctor::exit_code(findings);
  if (args.count("json")) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& f : findings) {
      list.push_back({{"level", doctor::level_name(f.level)},
                      {"check", f.check},
                      {"message", f.message},
                      {"fix", f.fix}});
    }
    std::cout << nlohmann::json{{"exit_code", code},
                                {"findings", list},
                                {"facts", facts_json(facts)}}
                     .dump(2)
              << "\n";
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

}  // namespace trainer::cli
