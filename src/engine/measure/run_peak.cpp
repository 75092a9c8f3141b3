#include "engine/measure/run_peak.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <optional>
#include <sstream>

#include "engine/measure/flops.h"
#include "util/fileio.h"
#include "util/format.h"
#include "util/gpu_monitor.h"
#include "util/log.h"

namespace trainer::engine {
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    const auto start = colon == std::string::npos ? colon : line.find_first_not_of(' ', colon + 1);
    if (start != std::string::npos) return line.substr(start);
  }
  return "CPU";
}

// The record's peak when it is readable and names `kind` and `dtype`; else nullopt, with `why`
// saying what it holds instead.
std::optional<double> recorded_peak(const std::string& path, const std::string& kind,
                                    const std::string& dtype, std::string& why) {
  std::ifstream in(path);
  if (!in) {
    why = "the run dir has no " + path;
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  const auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("device") || !j["device"].is_string() || !j.contains("dtype") ||
      !j["dtype"].is_string() || !j.contains("tflops") || !j["tflops"].is_number() ||
      !(j["tflops"].get<double>() > 0)) {
    why = path + " is not a peak record ({\"device\", \"dtype\", \"tflops\"})";
    return std::nullopt;
  }
  const double tflops = j["tflops"].get<double>();
  const std::string was = j["device"].get<std::string>() + ", " + j["dtype"].get<std::string>();
  if (was != kind + ", " + dtype) {
    why = strprintf(
        "the run's peak, %.6g TFLOP/s, was measured on %s (%s); MFU before and "
        "after this resume is against different peaks",
        tflops, was.c_str(), path.c_str());
    return std::nullopt;
  }
  return tflops;
}

}  // namespace

std::string device_kind(torch::Device device) {
  if (!device.is_cuda()) {
    return "cpu: " + cpu_model() + ", " + std::to_string(torch::get_num_threads()) + " threads";
  }
  std::string why;
  const auto monitor = GpuMonitor::open(device.has_index() ? device.index() : 0, &why);
  const std::string name = monitor ? monitor->name() : "";
  return "cuda: " + (name.empty() ? std::string("unnamed GPU") : name);
}

std::string dtype_name(c10::ScalarType dtype) {
  return dtype == torch::kBFloat16 ? "bfloat16" : dtype == torch::kHalf ? "float16" : "float32";
}

std::string peak_record_path(const std::string& run_dir) {
  return run_dir + "/peak_tflops.json";
}

RunPeak run_peak_tflops(const std::string& run_dir, torch::Device device, c10::ScalarType dtype,
                        bool resuming, bool record) {
  const std::string kind = device_kind(device), dtype_text = dtype_name(dtype);
  const std::string path = peak_record_path(run_dir);
  RunPeak peak;
  std::string why;
  if (resuming) {
    if (const auto recorded = recorded_peak(path, kind, dtype_text, why)) {
      peak.tflops = *recorded;
      peak.reused = true;
      peak.note = "the run's " + dtype_text + " matrix-product rate on " + kind +
                  ", measured at its start (" + path + ")";
      return peak;
    }
  }
  peak.tflops = matmul_peak_tflops(device, dtype);
  peak.note = "this device's measured " + dtype_text +
              " matrix-product rate (as trainer bench measures it) on " + kind;
  if (resuming) peak.note += "; re-measured: " + why;
  if (record) {
    const nlohmann::json j = {{"device", kind}, {"dtype", dtype_text}, {"tflops", peak.tflops}};
    try {
      write_text_atomically(path, j.dump() + "\n");
      peak.note += "; recorded in " + path;
    } catch (const std::exception& e) {
      log::warn("MFU: the peak cannot be recorded (" + std::string(e.what()) +
                "); a resume measures it again");
    }
  }
  return peak;
}

}  // namespace trainer::engine
