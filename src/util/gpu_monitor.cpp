#include "util/gpu_monitor.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <type_traits>

namespace trainer {
namespace {

// NVML's structs as its header declares them (nvml.h, stable ABI).
struct NvmlUtilization {
  unsigned gpu;
  unsigned memory;
};
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr int kNvmlTemperatureGpu = 0;

// The physical index of the process's device `index` under CUDA_VISIBLE_DEVICES (NVML ignores
// it); -1 when the variable names devices by UUID, which NVML resolves separately.
int physical_index(int index, std::string* uuid) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!visible || !*visible) return index;
  std::string list = visible;
  int i = 0;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = list.find(',', start);
    const std::string item =
        list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (i == index) {
      if (item.rfind("GPU-", 0) == 0) {
        *uuid = item;
        return -1;
      }
      return std::atoi(item.c_str());
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
    ++i;
  }
  return index;
}

}  // namespace

struct GpuMonitor::Api {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_index)(unsigned, void**) = nullptr;
  int (*by_uuid)(const char*, void**) = nullptr;
  int (*utilization)(void*, NvmlUtilization*) = nullptr;
  int (*memory)(void*, NvmlMemory*) = nullptr;
  int (*temperature)(void*, int, unsigned*) = nullptr;
  int (*power)(void*, unsigned*) = nullptr;
  int (*name)(void*, char*, unsigned) = nullptr;
  ~Api() {
    if (shutdown) shutdown();
    if (lib) ::dlclose(lib);
  }
};

std::unique_ptr<GpuMonitor> GpuMonitor::open(int index, std::string* why) {
  auto api = std::make_unique<Api>();
  api->lib = ::dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!api->lib) {
    *why = "libnvidia-ml.so.1 (NVML, part of the NVIDIA driver) is not installed";
    return nullptr;
  }
  auto load = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(api->lib, name));
    return fn != nullptr;
  };
  if (!load(api->init, "nvmlInit_v2") || !load(api->shutdown, "nvmlShutdown") ||
      !load(api->by_index, "nvmlDeviceGetHandleByIndex_v2") ||
      !load(api->by_uuid, "nvmlDeviceGetHandleByUUID") ||
      !load(api->utilization, "nvmlDeviceGetUtilizationRates") ||
      !load(api->memory, "nvmlDeviceGetMemoryInfo") ||
      !load(api->temperature, "nvmlDeviceGetTemperature") ||
      !load(api->power, "nvmlDeviceGetPowerUsage") || !load(api->name, "nvmlDeviceGetName")) {
    *why = "libnvidia-ml.so.1 lacks an expected function";
    return nullptr;
  }
  if (api->init() != 0) {
    api->shutdown = nullptr;  // not initialised
    *why = "NVML failed to initialise (driver not loaded?)";
    return nullptr;
  }
  std::string uuid;
  const int physical = physical_index(index, &uuid);
  void* device = nullptr;
  const int rc = physical >= 0 ? api->by_index(static_cast<unsigned>(physical), &device)
                               : api->by_uuid(uuid.c_str(), &device);
  if (rc != 0 || !device) {
    *why = "NVML has no device " + std::to_string(physical >= 0 ? physical : index);
    return nullptr;
  }
  return std::unique_ptr<GpuMonitor>(new GpuMonitor(std::move(api), device));
}

GpuMonitor::GpuMonitor(std::unique_ptr<Api> api, void* device)
    : api_(std::move(api)), device_(device) {}

GpuMonitor::~GpuMonitor() = default;

std::optional<GpuMonitor::Sample> GpuMonitor::sample() const {
  NvmlUtilization util{};
  NvmlMemory mem{};
  unsigned temp = 0, milliwatts = 0;
  if (api_->utilization(device_, &util) != 0 || api_->memory(device_, &mem) != 0) {
    return std::nullopt;
  }
  Sample s;
  s.util_pct = util.gpu;
  s.mem_used_mb = static_cast<double>(mem.used) / (1 << 20);
  s.mem_total_mb = static_cast<double>(mem.total) / (1 << 20);
  if (api_->temperature(device_, kNvmlTemperatureGpu, &temp) == 0) s.temp_c = temp;
  if (api_->power(device_, &milliwatts) == 0) s.power_w = milliwatts / 1000.0;
  return s;
}

std::string GpuMonitor::name() const {
  char buffer[96] = {};  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
  return api_->name(device_, buffer, sizeof buffer) == 0 ? std::string(buffer) : std::string();
}

}  // namespace trainer
