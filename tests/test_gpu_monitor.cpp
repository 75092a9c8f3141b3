// NVML loading: opening never fails hard; without NVML the reason is given.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "util/gpu_monitor.h"

namespace trainer {
namespace {

TEST(GpuMonitorOpenTest, AbsentNvmlOrDeviceIsReportedNotFatal) {
  std::string why;
  // Device 4096 does not exist on any machine: a monitor is never returned for it.
  EXPECT_EQ(GpuMonitor::open(/*index=*/4096, &why), nullptr);
  EXPECT_FALSE(why.empty());
  const bool has_nvml = ::dlopen("libnvidia-ml.so.1", RTLD_LAZY) != nullptr;
  if (!has_nvml) {
    EXPECT_NE(why.find("libnvidia-ml.so.1"), std::string::npos) << why;
  } else {
    EXPECT_NE(why.find("NVML"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace trainer
