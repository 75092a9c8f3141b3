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
  // Optional: older drivers lack some; each is null when missing.
  int (*clock)(void*, int, unsigned*) = nullptr;
  int (*max_clock)(void*, int, unsigned*) = nullptr;
  int (*power_limit)(void*, unsigned*) = nullptr;
  int (*power_limits)(void*, unsigned*, unsigned*) = nullptr;
  int (*clock_reasons)(void*, unsigned long long*) = nullptr;
  int (*mig_mode)(void*, unsigned*, unsigned*) = nullptr;
  int (*pcie_gen)(void*, unsigned*) = nullptr;
  int (*pcie_width)(void*, unsigned*) = nullptr;
  int (*pcie_max_gen)(void*, unsigned*) = nullptr;
  int (*pcie_max_width)(void*, unsigned*) = nullptr;
  int (*nvlink_state)(void*, unsigned, int*) = nullptr;
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
  load(api->clock, "nvmlDeviceGetClockInfo");
  load(api->max_clock, "nvmlDeviceGetMaxClockInfo");
  load(api->power_limit, "nvmlDeviceGetEnforcedPowerLimit");
  load(api->power_limits, "nvmlDeviceGetPowerManagementLimitConstraints");
  if (!load(api->clock_reasons, "nvmlDeviceGetCurrentClocksEventReasons")) {
    load(api->clock_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
  }
  load(api->mig_mode, "nvmlDeviceGetMigMode");
  load(api->pcie_gen, "nvmlDeviceGetCurrPcieLinkGeneration");
  load(api->pcie_width, "nvmlDeviceGetCurrPcieLinkWidth");
  load(api->pcie_max_gen, "nvmlDeviceGetMaxPcieLinkGeneration");
  load(api->pcie_max_width, "nvmlDeviceGetMaxPcieLinkWidth");
  load(api->nvlink_state, "nvmlDeviceGetNvLinkState");
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

GpuMonitor::Limits GpuMonitor::limits() const {
  constexpr int kClockSm = 1;         // NVML_CLOCK_SM
  constexpr unsigned kMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS
  const auto& a = *api_;
  Limits l;
  unsigned v = 0, w = 0;
  unsigned long long reasons = 0;
  int active = 0;
  if (a.clock && a.clock(device_, kClockSm, &v) == 0) l.sm_clock_mhz = static_cast<int>(v);
  if (a.max_clock && a.max_clock(device_, kClockSm, &v) == 0)
    l.max_sm_clock_mhz = static_cast<int>(v);
  if (a.power_limit && a.power_limit(device_, &v) == 0) l.power_limit_w = v / 1000.0;
  if (a.power_limits && a.power_limits(device_, &v, &w) == 0) l.max_power_limit_w = w / 1000.0;
  if (a.temperature(device_, kNvmlTemperatureGpu, &v) == 0) l.temp_c = v;
  if (a.clock_reasons && a.clock_reasons(device_, &reasons) == 0) l.clock_event_reasons = reasons;
  if (a.mig_mode && a.mig_mode(device_, &v, &w) == 0) l.mig = v == 1;
  if (a.pcie_gen && a.pcie_gen(device_, &v) == 0) l.pcie_gen = static_cast<int>(v);
  if (a.pcie_width && a.pcie_width(device_, &v) == 0) l.pcie_width = static_cast<int>(v);
  if (a.pcie_max_gen && a.pcie_max_gen(device_, &v) == 0) l.pcie_max_gen = static_cast<int>(v);
  if (a.pcie_max_width && a.pcie_max_width(device_, &v) == 0)
    l.pcie_max_width = static_cast<int>(v);
  for (unsigned link = 0; a.nvlink_state && link < kMaxLinks; ++link) {
    if (a.nvlink_state(device_, link, &active) == 0 && active == 1) ++l.nvlinks_active;
  }
  return l;
}

}  // namespace trainer
