// The doctor's rules on invented facts, its /proc/self/maps reading and its fat-binary reader.
#include <elf.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "doctor/findings.h"

namespace trainer::doctor {
namespace {

// A healthy CUDA machine: driver for CUDA 13.0, one H200, a matching LibTorch.
Facts healthy() {
  Facts f;
  f.trainer_version = "0.1.0";
  f.libtorch_version = "2.11.0";
  f.torch_cuda = "13.0";
  f.cuda_available = true;
  f.nvidia_device_files = true;
  f.driver_cuda = 13000;
  f.driver_version = "580.65.06";
  f.runtime_cuda = 13000;
  f.cudnn_built = 91900;
  f.cudnn_loaded = 91900;
  f.nccl_version = "2.27.7";
  f.arch_list = {"sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"};
  f.gpus = {Gpu{0, "NVIDIA H200", 9, 0, 143771}};
  f.shm_bytes = int64_t{32} << 30;
  f.cpu_cores = 16;
  f.memory_mb = 131072;
  return f;
}

// The findings of `check`, as "LEVEL check: message | fix" lines.
std::string report(const std::vector<Finding>& findings, const std::string& check_name) {
  std::string out;
  for (const auto& f : findings) {
    if (f.check == check_name) {
      out += std::string(level_name(f.level)) + " " + f.check + ": " + f.message + " | " + f.fix +
             "\n";
    }
  }
  return out;
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(DoctorTest, HealthyMachineHasNoWarningOrFailure) {
  const auto findings = check(healthy());
  for (const auto& f : findings) EXPECT_EQ(f.level, Level::ok) << f.check << ": " << f.message;
  EXPECT_EQ(exit_code(findings), 0);
  EXPECT_HAS(report(findings, "kernels"), "NVIDIA H200 (sm_90, 143771 MiB): LibTorch has native");
}

TEST(DoctorTest, DriverTooOldForLibTorch) {
  auto f = healthy();
  f.driver_cuda = 12020;
  f.driver_version = "535.104.05";
  const auto findings = check(f);
  EXPECT_HAS(report(findings, "driver"),
             "FAIL driver: driver 535.104.05 supports CUDA <= 12.2 but LibTorch needs 13.0 | "
             "install driver >= 580.65.06");
  EXPECT_EQ(exit_code(findings), 1);
  // Same major, older minor: minor-version compatibility.
  f.torch_cuda = "12.8";
  EXPECT_HAS(report(check(f), "driver"), "WARN driver");
  EXPECT_HAS(report(check(f), "driver"), "install driver >= 570.26");
}

TEST(DoctorTest, DriverTableIsOrderedAndLooksUpReleases) {
  const auto& table = driver_table();
  for (size_t i = 1; i < table.size(); ++i) EXPECT_GT(table[i - 1].cuda, table[i].cuda);
  EXPECT_EQ(min_driver_for(13000), "580.65.06");
  EXPECT_EQ(min_driver_for(12020), "535.54.03");
  EXPECT_EQ(min_driver_for(12070), "560.28.03");  // an unlisted release takes the one below
  EXPECT_EQ(min_driver_for(10000), "");
  EXPECT_EQ(parse_cuda("12.4"), 12040);
  EXPECT_EQ(cuda_text(12040), "12.4");
}

TEST(DoctorTest, NoGpuIsAWarningUnlessTheConfigWantsOne) {
  Facts f;
  f.torch_cuda = "13.0";
  auto findings = check(f);
  EXPECT_HAS(report(findings, "driver"), "WARN driver: no NVIDIA driver or GPU found");
  EXPECT_EQ(exit_code(findings), 0);
  f.wants_cuda = true;
  findings = check(f);
  EXPECT_HAS(report(findings, "driver"), "FAIL driver");
  EXPECT_EQ(exit_code(findings), 1);
  // Device files without the user-space driver.
  f.wants_cuda = false;
  f.nvidia_device_files = true;
  EXPECT_HAS(report(check(f), "driver"), "FAIL driver: NVIDIA device files exist but");
  // A CPU-only LibTorch.
  f = Facts{};
  EXPECT_HAS(report(check(f), "libtorch"), "WARN libtorch: this LibTorch is a CPU-only build");
}

TEST(DoctorTest, CudaUnavailableAndHiddenDevices) {
  auto f = healthy();
  f.cuda_available = false;
  f.gpus.clear();
  EXPECT_HAS(report(check(f), "cuda"), "FAIL cuda: CUDA available: False although a driver");
  f = healthy();
  f.env["CUDA_VISIBLE_DEVICES"] = "";
  EXPECT_HAS(report(check(f), "cuda"), "WARN cuda: CUDA_VISIBLE_DEVICES='' hides every GPU");
}

TEST(DoctorTest, KernelImages) {
  const std::vector<std::string> list = {"sm_80", "sm_90", "compute_90"};
  EXPECT_EQ(kernel_image(9, 0, list), KernelImage::sass);
  EXPECT_EQ(kernel_image(8, 6, list), KernelImage::sass);  // sm_80 code runs on 8.6
  EXPECT_EQ(kernel_image(10, 0, list), KernelImage::ptx);  // only compute_90 PTX
  EXPECT_EQ(kernel_image(7, 5, list), KernelImage::none);
  EXPECT_EQ(kernel_image(10, 0, {"sm_80", "sm_90"}), KernelImage::none);
  auto f = healthy();
  f.gpus = {Gpu{0, "Tesla T4", 7, 5, 15360}};
  f.arch_list = {"sm_80", "sm_90"};
  EXPECT_HAS(report(check(f), "kernels"),
             "FAIL kernels: GPU 0 Tesla T4 (sm_75, 15360 MiB): no kernel image for sm_75 "
             "(LibTorch has sm_80 sm_90)");
  f.arch_list = {"sm_80", "compute_70"};
  EXPECT_HAS(report(check(f), "kernels"), "WARN kernels");
  f.arch_list.clear();
  EXPECT_HAS(report(check(f), "kernels"), "WARN kernels");
}

TEST(DoctorTest, CudnnVersions) {
  auto f = healthy();
  f.cudnn_loaded = 8902;
  EXPECT_HAS(report(check(f), "cudnn"),
             "FAIL cudnn: cuDNN 8.9.2 loaded, LibTorch was built with 9.19.0");
  f.cudnn_loaded = 90100;
  EXPECT_HAS(report(check(f), "cudnn"), "WARN cudnn: cuDNN 9.1.0 loaded, older");
}

TEST(DoctorTest, MapsShowLibrariesAndDuplicates) {
  const std::string maps =
      "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06\n"
      "7f01-7f02 r--p 00001000 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06\n"
      "7f02-7f03 r-xp 00000000 08:01 2 /venv/torch/lib/libcudart-ab12cd34.so.13\n"
      "7f03-7f04 r-xp 00000000 08:01 3 /venv/nvidia/cudnn/lib/libcudnn.so.9\n"
      "7f04-7f05 r-xp 00000000 08:01 4 /usr/local/cuda/lib64/libcudnn.so.8.9.2\n"
      "7f05-7f06 r-xp 00000000 08:01 5 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "7f06-7f07 rw-p 00000000 00:00 0 [heap]\n";
  const auto libs = cuda_libraries(maps);
  ASSERT_EQ(libs.size(), 4u);
  EXPECT_EQ(libs[0].family, "libcuda");
  EXPECT_EQ(libs[1].family, "libcudart");
  EXPECT_EQ(libs[1].path, "/venv/torch/lib/libcudart-ab12cd34.so.13");
  auto f = healthy();
  f.maps = maps;
  const std::string r = report(check(f), "libraries");
  EXPECT_HAS(
      r,
      "FAIL libraries: libcudnn is loaded from 2 files: /venv/nvidia/cudnn/lib/libcudnn.so.9, "
      "/usr/local/cuda/lib64/libcudnn.so.8.9.2");
  EXPECT_HAS(r, "OK libraries: libcuda from /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06");
  f.env["LD_LIBRARY_PATH"] = "/usr/local/cuda/lib64";
  EXPECT_HAS(report(check(f), "libraries"), "WARN libraries: LD_LIBRARY_PATH has CUDA directories");
}

TEST(DoctorTest, SharedMemoryAndNcclVariables) {
  auto f = healthy();
  f.shm_bytes = int64_t{64} << 20;
  f.container = "docker";
  EXPECT_HAS(report(check(f), "shm"),
             "WARN shm: /dev/shm is 64 MiB; NCCL and shared-memory transfers need more | start the "
             "container with --shm-size=16g or --ipc=host");
  f.env["NCCL_P2P_DISABLE"] = "1";
  EXPECT_HAS(report(check(f), "nccl"), "WARN nccl: set: NCCL_P2P_DISABLE=1");
  EXPECT_HAS(report(check(f), "machine"), "in a docker container");
}

// A minimal ELF64 file whose .nv_fatbin section holds two fat binaries: one with sm_80 and
// sm_90 code, one with compute_90 PTX.
std::vector<uint8_t> fake_cuda_library() {
  auto fatbin = [](const std::vector<std::pair<uint16_t, uint32_t>>& entries) {
    std::vector<uint8_t> body;
    for (const auto& [kind, arch] : entries) {
      std::vector<uint8_t> e(64 + 16, 0);  // a 64-byte header and a 16-byte payload
      const uint32_t header = 64;
      const uint64_t payload = 16;
      std::memcpy(&e[0], &kind, 2);
      std::memcpy(&e[4], &header, 4);
      std::memcpy(&e[8], &payload, 8);
      std::memcpy(&e[28], &arch, 4);
      body.insert(body.end(), e.begin(), e.end());
    }
    std::vector<uint8_t> out(16 + body.size(), 0);  // a 16-byte header, then the entries
    const uint32_t magic = 0xBA55ED50u;
    const uint16_t version = 1, header = 16;
    const uint64_t size = body.size();
    std::memcpy(&out[0], &magic, 4);
    std::memcpy(&out[4], &version, 2);
    std::memcpy(&out[6], &header, 2);
    std::memcpy(&out[8], &size, 8);
    std::copy(body.begin(), body.end(), out.begin() + 16);
    return out;
  };
  std::vector<uint8_t> section = fatbin({{2, 80}, {2, 90}});
  section.resize(section.size() + 8, 0);  // padding between fat binaries
  const auto second = fatbin({{1, 90}});
  section.insert(section.end(), second.begin(), second.end());
  const std::string names = std::string("\0.shstrtab\0.nv_fatbin\0", 22);

  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_type = ET_DYN;
  eh.e_machine = EM_X86_64;
  eh.e_ehsize = sizeof(Elf64_Ehdr);
  eh.e_shentsize = sizeof(Elf64_Shdr);
  eh.e_shnum = 3;
  eh.e_shstrndx = 1;
  const uint64_t names_at = sizeof(Elf64_Ehdr);
  const uint64_t section_at = names_at + names.size();
  eh.e_shoff = section_at + section.size();
  Elf64_Shdr sh[3]{};
  sh[1].sh_name = 1;
  sh[1].sh_type = SHT_STRTAB;
  sh[1].sh_offset = names_at;
  sh[1].sh_size = names.size();
  sh[2].sh_name = 11;
  sh[2].sh_type = SHT_PROGBITS;
  sh[2].sh_offset = section_at;
  sh[2].sh_size = section.size();
  std::vector<uint8_t> out(reinterpret_cast<uint8_t*>(&eh),
                           reinterpret_cast<uint8_t*>(&eh) + sizeof eh);
  out.insert(out.end(), names.begin(), names.end());
  out.insert(out.end(), section.begin(), section.end());
  out.insert(out.end(), reinterpret_cast<uint8_t*>(sh), reinterpret_cast<uint8_t*>(sh) + sizeof sh);
  return out;
}

TEST(DoctorTest, FatbinArchitecturesFromAnElfFile) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("trainer_fatbin_" + std::to_string(::getpid()) + ".so");
  const auto bytes = fake_cuda_library();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  EXPECT_EQ(fatbin_archs(path.string()),
            (std::vector<std::string>{"compute_90", "sm_80", "sm_90"}));
  std::filesystem::remove(path);
  EXPECT_TRUE(fatbin_archs("/nonexistent").empty());
  EXPECT_TRUE(fatbin_archs("/proc/self/status").empty());  // not an ELF file
}

}  // namespace
}  // namespace trainer::doctor
