// trainer bench --kernels: the fused CUDA kernels' table and JSON.
#include <torch/types.h>

#include <nlohmann/json.hpp>

#include <exception>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "engine/use/kernel_bench.h"
#include "util/cxxopts.h"
#include "util/fileio.h"
#include "util/format.h"

namespace trainer::cli {
namespace {

std::string kernel_table(const engine::KernelReport& r) {
  std::string out = strprintf("trainer bench --kernels: %s, device copy %.0f GB/s\n\n",
                              r.device.c_str(), r.copy_gbps);
  out += strprintf("%-40s %-22s %9s %9s %9s %9s %8s %7s\n", "kernel", "shape", "fused ms",
                   "aten ms", "fused GB/s", "aten GB/s", "of copy", "speedup");
  for (const auto& k : r.rows) {
    out += strprintf("%-40s %-22s %9.3f %9.3f %9.0f %9.0f %7.0f%% %6.2fx\n", k.name.c_str(),
                     k.shape.c_str(), k.fused_ms, k.aten_ms, k.fused_gbps, k.aten_gbps,
                     100.0 * k.of_copy, k.aten_ms / k.fused_ms);
  }
  return out;
}

nlohmann::json kernel_json(const engine::KernelReport& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& k : r.rows) {
    rows.push_back({{"name", k.name},
                    {"shape", k.shape},
                    {"bytes", k.bytes},
                    {"fused_ms", k.fused_ms},
                    {"aten_ms", k.aten_ms},
                    {"fused_gbps", k.fused_gbps},
                    {"aten_gbps", k.aten_gbps},
                    {"of_copy", k.of_copy}});
  }
  return {{"device", r.device}, {"copy_gbps", r.copy_gbps}, {"kernels", rows}};
}

}  // namespace

int bench_kernels(const cxxopts::ParseResult& args) {
  if (args.count("json")) {  // refused before the measurement, not after it
    const std::string why = output_problem(args["json"].as<std::string>(), OutputKind::file, {});
    if (!why.empty()) throw UsageError("--json " + why);
  }
  const std::string name = args.count("device") ? args["device"].as<std::string>() : "cuda";
  torch::Device device(torch::kCPU);
  try {
    device = torch::Device(name);
  } catch (const std::exception&) {
    throw UsageError("--device: '" + name + "' is not a device (cuda, cuda:N)");
  }
  const auto report = engine::bench_kernels(device);
  std::cout << kernel_table(report) << std::flush;
  if (args.count("json")) {
    write_text_atomically(args["json"].as<std::string>(), kernel_json(report).dump(2) + "\n");
  }
  return 0;
}

}  // namespace trainer::cli
