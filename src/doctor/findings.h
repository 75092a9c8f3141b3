// The doctor's checks of a GPU environment: facts gathered by probing (doctor/probe.h), turned
// into findings by pure functions, so every rule is testable with invented facts.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trainer::doctor {

enum class Level { ok, warn, fail };
const char* level_name(Level level);  // "OK", "WARN", "FAIL"

struct Finding {
  Level level = Level::ok;
  std::string check;    // e.g. "driver"
  std::string message;  // what was found
  std::string fix;      // one line; empty for OK
};

struct Gpu {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  int64_t total_mb = 0;
};

// Everything the checks look at. Versions use CUDA's integer encoding (12020 = 12.2).
struct Facts {
  std::string trainer_version;
  std::string libtorch_version;
  std::string torch_cuda;            // CUDA LibTorch was built with ("13.0"); "" = CPU-only build
  bool cuda_available = false;       // LibTorch sees at least one usable device
  bool nvidia_device_files = false;  // /dev/nvidia0 or /dev/nvidiactl exists
  int driver_cuda = 0;               // the highest CUDA the driver supports; 0 = no driver
  std::string driver_version;        // e.g. "580.65.06"; "" when unknown
  int runtime_cuda = 0;              // the CUDA runtime LibTorch loaded
  int cudnn_built = 0, cudnn_loaded = 0;  // e.g. 91900; 0 = unknown
  std::string nccl_version;               // e.g. "2.27.3"; "" = not loaded
  std::vector<std::string> arch_list;     // compiled into LibTorch: "sm_90", "compute_90", ...
  std::vector<Gpu> gpus;
  std::string maps;                        // /proc/self/maps
  std::map<std::string, std::string> env;  // the variables that matter, when set
  int64_t shm_bytes = -1;                  // size of /dev/shm; -1 = absent
  int cpu_cores = 0;
  int64_t memory_mb = 0;
  std::string container;    // "docker", "podman", "kubernetes" or ""
  bool wants_cuda = false;  // the config asks for a CUDA device
};

// The minimum Linux driver of each CUDA toolkit release.
struct DriverRequirement {
  int cuda;                // 13000 = 13.0
  const char* min_driver;  // e.g. "580.65.06"
};
// Source: NVIDIA CUDA Toolkit Release Notes, Table 3 "CUDA Toolkit and Corresponding Driver
// Versions" (Linux x86_64, general-availability releases).
const std::vector<DriverRequirement>& driver_table();

// The minimum driver for CUDA `cuda` (the entry of the same or the next lower release), or "".
std::string min_driver_for(int cuda);

// "12.2" from 12020.
std::string cuda_text(int version);
// 13000 from "13.0"; 0 when unparsable.
int parse_cuda(const std::string& text);

// How LibTorch can run on a GPU of compute capability major.minor: native code for it (or for
// an older minor of the same major), PTX that the driver compiles, or nothing.
enum class KernelImage { sass, ptx, none };
KernelImage kernel_image(int cc_major, int cc_minor, const std::vector<std::string>& arch_list);

// A shared library mapped into the process: its family ("libcudnn") and file.
struct MappedLibrary {
  std::string family;  // the file name up to ".so"
  std::string path;
};
// The shared libraries in /proc/self/maps text, each file once, in order of appearance.
std::vector<MappedLibrary> mapped_libraries(const std::string& maps);
// Those of them that belong to CUDA (the driver, runtime, cuBLAS, cuDNN, NCCL, ...).
std::vector<MappedLibrary> cuda_libraries(const std::string& maps);

// The architectures of the CUDA fat binaries in the ELF file `path` (its .nv_fatbin section):
// "sm_90" for native code, "compute_90" for PTX, unique, PTX first, each by number. Empty when the
// file has none or cannot be read.
std::vector<std::string> fatbin_archs(const std::string& path);

// Every check, in report order.
std::vector<Finding> check(const Facts& facts);

// 0 when no finding is FAIL, else 1.
int exit_code(const std::vector<Finding>& findings);

}  // namespace trainer::doctor
