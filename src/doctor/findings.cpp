#include "doctor/findings.h"

#include <elf.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <sstream>

#include "util/strings.h"

namespace trainer::doctor {
namespace {

// Library families the doctor follows in the process's memory map.
const std::vector<std::string> kCudaFamilies = {"libcuda",
                                                "libcudart",
                                                "libcublas",
                                                "libcublasLt",
                                                "libcudnn",
                                                "libnccl",
                                                "libnvrtc",
                                                "libcufft",
                                                "libcurand",
                                                "libcusparse",
                                                "libcusolver",
                                                "libnvJitLink",
                                                "libnvidia-ml",
                                                "libcudnn_ops",
                                                "libcudnn_cnn",
                                                "libcudnn_graph",
                                                "libcudnn_engines_precompiled"};

// "sm_90" / "compute_90" -> 90; -1 for anything else.
int arch_number(const std::string& arch, const std::string& prefix) {
  if (arch.compare(0, prefix.size(), prefix) != 0) return -1;
  try {
    // Suffixes such as "sm_90a" (architecture-specific features) count as the base number.
    return std::stoi(arch.substr(prefix.size()));
  } catch (const std::exception&) {
    return -1;
  }
}

std::string cudnn_text(int v) {
  // cuDNN 9 encodes major * 10000 + minor * 100 + patch; cuDNN 8: major * 1000 + minor * 100.
  const int major = v >= 10000 ? v / 10000 : v / 1000;
  const int minor = v >= 10000 ? (v / 100) % 100 : (v / 100) % 10;
  const int patch = v % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

int cudnn_major(int v) {
  return v >= 10000 ? v / 10000 : v / 1000;
}

}  // namespace

const char* level_name(Level level) {
  switch (level) {
    case Level::ok:
      return "OK";
    case Level::warn:
      return "WARN";
    case Level::fail:
      return "FAIL";
  }
  return "?";
}

const std::vector<DriverRequirement>& driver_table() {
  static const std::vector<DriverRequirement> table = {
      {13000, "580.65.06"}, {12090, "575.51.03"}, {12080, "570.26"},    {12060, "560.28.03"},
      {12050, "555.42.02"}, {12040, "550.54.14"}, {12030, "545.23.06"}, {12020, "535.54.03"},
      {12010, "530.30.02"}, {12000, "525.60.13"}, {11080, "520.61.05"},
  };
  return table;
}

std::string min_driver_for(int cuda) {
  for (const auto& r : driver_table())
    if (r.cuda <= cuda) return r.min_driver;
  return "";
}

std::string cuda_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

int parse_cuda(const std::string& text) {
  int major = 0, minor = 0;
  if (std::sscanf(text.c_str(), "%d.%d", &major, &minor) < 1) return 0;
  return major * 1000 + minor * 10;
}

KernelImage kernel_image(int cc_major, int cc_minor, const std::vector<std::string>& arch_list) {
  const int cc = cc_major * 10 + cc_minor;
  bool ptx = false;
  for (const auto& arch : arch_list) {
    const int sm = arch_number(arch, "sm_");
    // A cubin runs on devices of its major version with an equal or higher minor.
    if (sm >= 0 && sm / 10 == cc_major && sm <= cc) return KernelImage::sass;
    const int compute = arch_number(arch, "compute_");
    if (compute >= 0 && compute <= cc) ptx = true;
  }
  return ptx ? KernelImage::ptx : KernelImage::none;
}

std::vector<MappedLibrary> mapped_libraries(const std::string& maps) {
  std::vector<MappedLibrary> out;
  std::set<std::string> seen;
  std::istringstream in(maps);
  for (std::string line; std::getline(in, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string file = path.substr(path.rfind('/') + 1);
    const auto so = file.find(".so");
    if (so == std::string::npos) continue;
    std::string family = file.substr(0, so);
    // Wheels name some copies with a hash: libcudart-ab12cd34.so.13.
    const auto dash = family.find('-');
    if (dash != std::string::npos && family.size() - dash == 9) family = family.substr(0, dash);
    if (seen.insert(path).second) out.push_back(MappedLibrary{family, path});
  }
  return out;
}

std::vector<MappedLibrary> cuda_libraries(const std::string& maps) {
  std::vector<MappedLibrary> out;
  for (auto& lib : mapped_libraries(maps)) {
    if (std::find(kCudaFamilies.begin(), kCudaFamilies.end(), lib.family) != kCudaFamilies.end()) {
      out.push_back(std::move(lib));
    }
  }
  return out;
}

namespace {

// Reads `size` bytes at `offset` of a file.
class FileReader {
 public:
  explicit FileReader(const std::string& path)
      : file_(std::fopen(path.c_str(), "rb"), &std::fclose) {}
  bool ok() const { return file_ != nullptr; }
  bool read(uint64_t offset, void* out, size_t size) const {
    return fseeko(file_.get(), static_cast<off_t>(offset), SEEK_SET) == 0 &&
           std::fread(out, 1, size, file_.get()) == size;
  }

 private:
  std::unique_ptr<FILE, int (*)(FILE*)> file_;
};

// The architectures of the fat binaries in [pos, end): each a 16-byte header (magic, version,
// header size, payload size), then entries of a header (kind at 0: 1 PTX, 2 ELF; header size at
// 4; payload size at 8; architecture at 28) and a payload.
void scan_fatbins(const FileReader& file, uint64_t pos, uint64_t end,
                  std::set<std::string>& archs) {
  while (pos + 16 <= end) {
    uint8_t h[16];
    if (!file.read(pos, h, sizeof h)) break;
    uint32_t magic;
    uint16_t header_size;
    uint64_t fat_size;
    std::memcpy(&magic, h, 4);
    std::memcpy(&header_size, h + 6, 2);
    std::memcpy(&fat_size, h + 8, 8);
    if (magic != 0xBA55ED50u) {
      pos += 8;  // padding between fat binaries
      continue;
    }
    uint64_t entry = pos + header_size;
    const uint64_t fat_end = std::min(end, entry + fat_size);
    while (entry + 32 <= fat_end) {
      uint8_t e[32];
      if (!file.read(entry, e, sizeof e)) break;
      uint16_t kind;
      uint32_t entry_header, arch;
      uint64_t payload;
      std::memcpy(&kind, e, 2);
      std::memcpy(&entry_header, e + 4, 4);
      std::memcpy(&payload, e + 8, 8);
      std::memcpy(&arch, e + 28, 4);
      if (entry_header < 32 || arch == 0 || arch > 1000) break;
      if (kind == 1) archs.insert("compute_" + std::to_string(arch));
      if (kind == 2) archs.insert("sm_" + std::to_string(arch));
      entry += entry_header + payload;
    }
    pos += header_size + fat_size;
  }
}

}  // namespace

std::vector<std::string> fatbin_archs(const std::string& path) {
  std::set<std::string> archs;
  const FileReader file(path);
  if (!file.ok()) return {};
  Elf64_Ehdr eh;
  if (!file.read(0, &eh, sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr)) {
    return {};
  }
  std::vector<Elf64_Shdr> sections(eh.e_shnum);
  if (sections.empty() || eh.e_shstrndx >= eh.e_shnum ||
      !file.read(eh.e_shoff, sections.data(), sections.size() * sizeof(Elf64_Shdr))) {
    return {};
  }
  const auto& names_header = sections[eh.e_shstrndx];
  std::vector<char> names(names_header.sh_size + 1, '\0');
  if (!file.read(names_header.sh_offset, names.data(), names_header.sh_size)) return {};
  for (const auto& sh : sections) {
    if (sh.sh_name < names_header.sh_size && std::strcmp(&names[sh.sh_name], ".nv_fatbin") == 0) {
      scan_fatbins(file, sh.sh_offset, sh.sh_offset + sh.sh_size, archs);
    }
  }
  // PTX before native code, each by number (sm_75 before sm_100).
  std::vector<std::string> out(archs.begin(), archs.end());
  auto key = [](const std::string& a) {
    const auto underscore = a.find('_');
    return std::make_pair(a.substr(0, underscore), std::atoi(a.c_str() + underscore + 1));
  };
  std::sort(out.begin(), out.end(),
            [&](const std::string& a, const std::string& b) { return key(a) < key(b); });
  return out;
}

namespace {

// The findings of one check().
struct Report {
  void add(Level level, const std::string& check, const std::string& message,
           const std::string& fix = "") {
    out.push_back(Finding{level, check, message, fix});
  }
  std::vector<Finding> out;
};

// The driver: present, and new enough for the CUDA LibTorch was built with.
void check_driver(const Facts& f, int torch_cuda, Level no_gpu_level, Report& r) {
  if (f.driver_cuda == 0) {
    if (f.nvidia_device_files) {
      r.add(
          Level::fail, "driver",
          "NVIDIA device files exist but the driver library libcuda.so.1 could not be loaded",
          "install the NVIDIA driver's user-space libraries matching the kernel module (nvidia-smi "
          "must work); in a container, run with --gpus all and the NVIDIA Container Toolkit");
    } else {
      r.add(no_gpu_level, "driver", "no NVIDIA driver or GPU found; training runs on the CPU",
            f.wants_cuda ? "install the NVIDIA driver or set device: cpu" : "");
    }
  } else {
    const std::string driver =
        f.driver_version.empty() ? "the driver" : "driver " + f.driver_version;
    const std::string need = min_driver_for(torch_cuda);
    if (torch_cuda > 0 && f.driver_cuda / 1000 < torch_cuda / 1000) {
      r.add(Level::fail, "driver",
            driver + " supports CUDA <= " + cuda_text(f.driver_cuda) + " but LibTorch needs " +
                cuda_text(torch_cuda),
            "install driver >= " + (need.empty() ? std::string("a newer one") : need) +
                ", or a LibTorch built for CUDA " + std::to_string(f.driver_cuda / 1000) + ".x");
    } else if (torch_cuda > 0 && f.driver_cuda < torch_cuda) {
      r.add(Level::warn, "driver",
            driver + " supports CUDA <= " + cuda_text(f.driver_cuda) + ", older than LibTorch's " +
                cuda_text(torch_cuda) +
                " (minor-version compatibility: most kernels run, PTX JIT and new APIs may fail)",
            "install driver >= " + need);
    } else {
      r.add(Level::ok, "driver", driver + ", supports CUDA <= " + cuda_text(f.driver_cuda));
    }
  }
}

// CUDA as LibTorch sees it, and CUDA_VISIBLE_DEVICES.
void check_cuda(const Facts& f, int torch_cuda, Report& r) {
  if (f.driver_cuda > 0 && torch_cuda > 0) {
    if (!f.cuda_available) {
      r.add(Level::fail, "cuda", "CUDA available: False although a driver is installed",
            "check CUDA_VISIBLE_DEVICES, the permissions of /dev/nvidia*, and (in a container) "
            "--gpus all; nvidia-smi must list the GPUs");
    } else {
      r.add(Level::ok, "cuda",
            "CUDA available: True, " + std::to_string(f.gpus.size()) + " device(s), runtime " +
                (f.runtime_cuda ? cuda_text(f.runtime_cuda) : std::string("?")));
    }
  }
  const auto visible = f.env.find("CUDA_VISIBLE_DEVICES");
  if (visible != f.env.end() &&
      (visible->second.empty() || visible->second == "-1" || visible->second == "NoDevFiles")) {
    r.add(Level::warn, "cuda", "CUDA_VISIBLE_DEVICES='" + visible->second + "' hides every GPU",
          "unset CUDA_VISIBLE_DEVICES or list the GPUs to use, e.g. 0,1");
  }
}

// Kernel images per GPU.
void check_kernels(const Facts& f, Report& r) {
  for (const auto& gpu : f.gpus) {
    const std::string sm = "sm_" + std::to_string(gpu.cc_major) + std::to_string(gpu.cc_minor);
    const std::string what = "GPU " + std::to_string(gpu.index) + " " + gpu.name + " (" + sm +
                             ", " + std::to_string(gpu.total_mb) + " MiB)";
    if (f.arch_list.empty()) {
      r.add(Level::warn, "kernels", what + ": the architectures compiled into LibTorch are unknown",
            "");
      continue;
    }
    switch (kernel_image(gpu.cc_major, gpu.cc_minor, f.arch_list)) {
      case KernelImage::sass:
        r.add(Level::ok, "kernels", what + ": LibTorch has native kernels for it");
        break;
      case KernelImage::ptx:
        r.add(Level::warn, "kernels",
              what + ": only PTX for it; the driver compiles kernels at first use (slow start)",
              "use a LibTorch built with " + sm + " in TORCH_CUDA_ARCH_LIST");
        break;
      case KernelImage::none:
        r.add(Level::fail, "kernels",
              what + ": no kernel image for " + sm + " (LibTorch has " + join(f.arch_list, " ") +
                  "); expect 'no kernel image is available for execution on the device'",
              "install a LibTorch built for " + sm + " (a newer CUDA wheel)");
        break;
    }
  }
}

// cuDNN and NCCL.
void check_cudnn_nccl(const Facts& f, Report& r) {
  if (f.cudnn_built && f.cudnn_loaded) {
    if (cudnn_major(f.cudnn_built) != cudnn_major(f.cudnn_loaded)) {
      r.add(Level::fail, "cudnn",
            "cuDNN " + cudnn_text(f.cudnn_loaded) + " loaded, LibTorch was built with " +
                cudnn_text(f.cudnn_built),
            "remove the other cuDNN from LD_LIBRARY_PATH so LibTorch's own copy loads");
    } else if (f.cudnn_loaded < f.cudnn_built) {
      r.add(Level::warn, "cudnn",
            "cuDNN " + cudnn_text(f.cudnn_loaded) + " loaded, older than LibTorch's " +
                cudnn_text(f.cudnn_built),
            "use the cuDNN LibTorch ships (unset LD_LIBRARY_PATH entries with an older libcudnn)");
    } else {
      r.add(Level::ok, "cudnn", "cuDNN " + cudnn_text(f.cudnn_loaded));
    }
  } else if (f.cudnn_built) {
    r.add(Level::ok, "cudnn",
          "LibTorch built with cuDNN " + cudnn_text(f.cudnn_built) +
              " (not loaded: no GPU work yet)");
  }
  if (!f.nccl_version.empty()) r.add(Level::ok, "nccl", "NCCL " + f.nccl_version);
}

// The libraries actually mapped, duplicates, and LD_LIBRARY_PATH.
void check_libraries(const Facts& f, int torch_cuda, Report& r) {
  const auto libs = cuda_libraries(f.maps);
  std::map<std::string, std::vector<std::string>> by_family;
  for (const auto& lib : libs) by_family[lib.family].push_back(lib.path);
  for (const auto& [family, paths] : by_family) {
    if (paths.size() > 1) {
      r.add(Level::fail, "libraries",
            family + " is loaded from " + std::to_string(paths.size()) +
                " files: " + join(paths, ", "),
            "keep one: remove the directory of the other from LD_LIBRARY_PATH (or uninstall it)");
    } else {
      r.add(Level::ok, "libraries", family + " from " + paths.front());
    }
  }
  const auto ld = f.env.find("LD_LIBRARY_PATH");
  if (ld != f.env.end() && ld->second.find("cuda") != std::string::npos && torch_cuda > 0) {
    r.add(Level::warn, "libraries",
          "LD_LIBRARY_PATH has CUDA directories (" + ld->second +
              "): their libraries take precedence over the ones LibTorch was built with",
          "drop them from LD_LIBRARY_PATH unless a version mismatch is intended");
  }
}

// Shared memory, NCCL variables, the machine.
void check_machine(const Facts& f, Report& r) {
  const int64_t gib = int64_t{1} << 30;
  if (f.shm_bytes >= 0 && f.shm_bytes < gib) {
    r.add(Level::warn, "shm",
          "/dev/shm is " + std::to_string(f.shm_bytes >> 20) +
              " MiB; NCCL and shared-memory transfers need more",
          f.container.empty() ? "remount /dev/shm larger (mount -o remount,size=16G /dev/shm)"
                              : "start the container with --shm-size=16g or --ipc=host");
  }
  std::vector<std::string> nccl;
  for (const auto& [k, v] : f.env)
    if (k.compare(0, 5, "NCCL_") == 0) nccl.push_back(k + "=" + v);
  if (!nccl.empty()) {
    const bool disabled = f.env.count("NCCL_P2P_DISABLE") || f.env.count("NCCL_IB_DISABLE");
    r.add(disabled ? Level::warn : Level::ok, "nccl", "set: " + join(nccl, " "),
          disabled ? "NCCL_P2P_DISABLE/NCCL_IB_DISABLE slow multi-GPU training; unset them unless "
                     "a transport is broken"
                   : "");
  }
  r.add(Level::ok, "machine",
        std::to_string(f.cpu_cores) + " CPU cores, " + std::to_string(f.memory_mb / 1024) +
            " GiB memory" + (f.container.empty() ? "" : ", in a " + f.container + " container"));
}

}  // namespace

std::vector<Finding> check(const Facts& f) {
  Report r;
  const Level no_gpu_level = f.wants_cuda ? Level::fail : Level::warn;
  r.add(Level::ok, "versions",
        "trainer " + f.trainer_version + ", LibTorch " + f.libtorch_version + ", built with " +
            (f.torch_cuda.empty() ? std::string("no CUDA") : "CUDA " + f.torch_cuda));
  const int torch_cuda = parse_cuda(f.torch_cuda);
  if (torch_cuda == 0) {
    r.add(no_gpu_level, "libtorch", "this LibTorch is a CPU-only build",
          "use a CUDA build of LibTorch (the cu* torch wheel or LibTorch zip) for GPU training");
  }
  check_driver(f, torch_cuda, no_gpu_level, r);
  check_cuda(f, torch_cuda, r);
  check_kernels(f, r);
  check_cudnn_nccl(f, r);
  check_libraries(f, torch_cuda, r);
  check_machine(f, r);
  return r.out;
}

int exit_code(const std::vector<Finding>& findings) {
  for (const auto& f : findings)
    if (f.level == Level::fail) return 1;
  return 0;
}

}  // namespace trainer::doctor
