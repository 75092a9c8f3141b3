#include "doctor/probe.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <torch/cuda.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace trainer::doctor {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// A library already in the process, or loaded now; nullptr when absent.
void* open_library(const char* name, bool only_if_loaded) {
  return ::dlopen(name, RTLD_LAZY | RTLD_LOCAL | (only_if_loaded ? RTLD_NOLOAD : 0));
}

template <class Fn>
Fn symbol(void* lib, const char* name) {
  return lib ? reinterpret_cast<Fn>(::dlsym(lib, name)) : nullptr;
}

// The driver API through libcuda.so.1 (CUresult is an int; 0 = success).
void probe_driver(Facts& f) {
  void* cuda = open_library("libcuda.so.1", /*only_if_loaded=*/false);
  if (!cuda) return;
  using Init = int (*)(unsigned);
  using DriverVersion = int (*)(int*);
  using DeviceCount = int (*)(int*);
  using DeviceGet = int (*)(int*, int);
  using DeviceName = int (*)(char*, int, int);
  using DeviceAttribute = int (*)(int*, int, int);
  using DeviceMemory = int (*)(size_t*, int);
  auto init = symbol<Init>(cuda, "cuInit");
  auto driver_version = symbol<DriverVersion>(cuda, "cuDriverGetVersion");
  auto count = symbol<DeviceCount>(cuda, "cuDeviceGetCount");
  auto get = symbol<DeviceGet>(cuda, "cuDeviceGet");
  auto name = symbol<DeviceName>(cuda, "cuDeviceGetName");
  auto attribute = symbol<DeviceAttribute>(cuda, "cuDeviceGetAttribute");
  auto memory = symbol<DeviceMemory>(cuda, "cuDeviceTotalMem_v2");
  int v = 0;
  if (driver_version && driver_version(&v) == 0) f.driver_cuda = v;
  if (!init || init(0) != 0 || !count || !get) return;
  int n = 0;
  if (count(&n) != 0) return;
  constexpr int kCcMajor = 75, kCcMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_*
  for (int i = 0; i < n; ++i) {
    int dev = 0;
    if (get(&dev, i) != 0) continue;
    Gpu gpu;
    gpu.index = i;
    char buf[256] = {0};
    if (name && name(buf, sizeof buf - 1, dev) == 0) gpu.name = buf;
    if (attribute) {
      attribute(&gpu.cc_major, kCcMajor, dev);
      attribute(&gpu.cc_minor, kCcMinor, dev);
    }
    size_t bytes = 0;
    if (memory && memory(&bytes, dev) == 0) gpu.total_mb = static_cast<int64_t>(bytes >> 20);
    f.gpus.push_back(gpu);
  }
}

// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  ..." -> "580.65.06".
std::string kernel_module_version() {
  std::istringstream in(read_text("/proc/driver/nvidia/version"));
  std::string word, previous;
  while (in >> word) {
    if (previous == "Module") return word;
    previous = word;
  }
  return "";
}

std::string container_kind() {
  if (exists("/.dockerenv")) return "docker";
  if (exists("/run/.containerenv")) return "podman";
  const std::string cgroup = read_text("/proc/1/cgroup");
  if (cgroup.find("kubepods") != std::string::npos) return "kubernetes";
  if (cgroup.find("docker") != std::string::npos) return "docker";
  return "";
}

}  // namespace

namespace {

// The cuDNN and NCCL versions of the libraries loaded, and the architectures LibTorch's CUDA
// library holds kernels for.
void probe_libraries(Facts& f) {
  using CudnnVersion = size_t (*)();
  for (const char* lib : {"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"}) {
    if (auto version = symbol<CudnnVersion>(open_library(lib, true), "cudnnGetVersion")) {
      f.cudnn_loaded = static_cast<int>(version());
      break;
    }
  }
  using NcclVersion = int (*)(int*);
  if (auto version = symbol<NcclVersion>(open_library("libnccl.so.2", true), "ncclGetVersion")) {
    int v = 0;
    if (version(&v) == 0 && v > 0) {
      // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
      f.nccl_version = std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." +
                       std::to_string(v % 100);
    }
  }
  f.maps = read_text("/proc/self/maps");
  for (const auto& lib : mapped_libraries(f.maps)) {
    if (lib.family == "libtorch_cuda") {
      f.arch_list = fatbin_archs(lib.path);
      break;
    }
  }
}

// The environment variables that matter, shared memory, cores, memory and the container.
void probe_machine(Facts& f) {
  for (const char* name :
       {"CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "PATH", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME",
        "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET", "NCCL_ALGO",
        "NCCL_PROTO", "CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG"}) {
    if (const char* v = std::getenv(name)) f.env[name] = v;
  }
  struct statvfs vfs;
  if (::statvfs("/dev/shm", &vfs) == 0) {
    f.shm_bytes = static_cast<int64_t>(vfs.f_blocks) * static_cast<int64_t>(vfs.f_frsize);
  }
  f.cpu_cores = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  f.memory_mb = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE) >> 20;
  f.container = container_kind();
}

}  // namespace

Facts probe(bool wants_cuda) {
  Facts f;
  f.wants_cuda = wants_cuda;
  f.trainer_version = TRAINER_VERSION;
  f.libtorch_version = TORCH_VERSION;
  try {
    const auto& hooks = at::detail::getCUDAHooks();
    const long runtime = hooks.versionCUDART();
    if (runtime > 0) f.torch_cuda = cuda_text(static_cast<int>(runtime));
    f.runtime_cuda = static_cast<int>(runtime);
    f.cudnn_built = static_cast<int>(hooks.versionCuDNN());
  } catch (const std::exception&) {
    // A CPU-only LibTorch has no CUDA hooks.
  }
  try {
    f.cuda_available = torch::cuda::is_available();
  } catch (const std::exception&) {
    f.cuda_available = false;
  }
  f.nvidia_device_files = exists("/dev/nvidiactl") || exists("/dev/nvidia0");
  probe_driver(f);
  f.driver_version = kernel_module_version();
  probe_libraries(f);
  probe_machine(f);
  return f;
}

}  // namespace trainer::doctor
