// GPU utilisation, memory, temperature and power through NVML, loaded at run time
// (libnvidia-ml.so.1 from the driver), so the binary needs no NVML at build or start-up.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace trainer {

class GpuMonitor {
 public:
  struct Sample {
    double util_pct = 0;     // GPU busy time over the driver's last sampling period
    double mem_used_mb = 0;  // device memory in use (all processes)
    double mem_total_mb = 0;
    double temp_c = 0;
    double power_w = 0;
  };

  // A monitor of CUDA device `index` (as the process numbers it), or nullptr with `why` set when
  // NVML or the device is not there.
  static std::unique_ptr<GpuMonitor> open(int index, std::string* why);
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  // The current readings; nullopt when NVML reports an error.
  std::optional<Sample> sample() const;
  // The product name, e.g. "NVIDIA H200"; "" when NVML reports an error.
  std::string name() const;

  // What bounds the device's speed; a field NVML does not report stays 0.
  struct Limits {
    int sm_clock_mhz = 0, max_sm_clock_mhz = 0;
    double power_limit_w = 0, max_power_limit_w = 0;
    double temp_c = 0;
    uint64_t clock_event_reasons = 0;  // nvmlDeviceGetCurrentClocksEventReasons' bitmask
    bool mig = false;                  // MIG mode on
    int pcie_gen = 0, pcie_width = 0, pcie_max_gen = 0, pcie_max_width = 0;
    int nvlinks_active = 0;
  };
  Limits limits() const;

 private:
  struct Api;
  GpuMonitor(std::unique_ptr<Api> api, void* device);
  std::unique_ptr<Api> api_;
  void* device_;
};

}  // namespace trainer
