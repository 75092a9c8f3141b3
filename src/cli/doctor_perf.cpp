// trainer doctor --perf: the server measured against its specification, and what limits a job.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "config/loader.h"
#include "distributed/env.h"
#include "doctor/perf.h"
#include "engine/loop/trainer.h"
#include "engine/setup/components.h"
#include "engine/use/perf_probe.h"
#include "util/format.h"
#include "util/gpu_monitor.h"

namespace trainer::cli {
namespace {

namespace fs = std::filesystem;

doctor::GpuState gpu_state(torch::Device device) {
  std::string why;
  const auto monitor = device.is_cuda() ? GpuMonitor::open(device.index(), &why) : nullptr;
  return monitor ? monitor->limits() : doctor::GpuState{};
}

// Compute and memory rows: a GPU against its spec table entry, the CPU against a roofline of its
// threads times one thread's measured rate.
void device_rows(const engine::DevicePerf& d, const doctor::GpuState& state,
                 std::vector<doctor::PerfRow>& rows) {
  const auto spec = d.cuda ? doctor::gpu_spec(d.name) : std::nullopt;
  for (const auto& [dtype, tflops] : d.matmul_tflops) {
    const double expected = spec                         ? doctor::spec_tflops(*spec, dtype)
                            : !d.cuda && dtype == "fp32" ? d.single_thread_tflops * d.threads
                                                         : 0.0;
    rows.push_back(doctor::compute_row(dtype, tflops, expected, d.cuda ? &state : nullptr));
  }
  if (d.cuda) {
    rows.push_back(doctor::bandwidth_row(
        "memory", "device copy", d.copy_gbps, spec ? doctor::kCopyOfSpec * spec->memory_gbps : 0.0,
        "HBM below spec: memory clock, ECC errors or another process (nvidia-smi -q -d MEMORY)"));
    rows.push_back(doctor::pcie_row("h2d pinned", d.h2d_pinned, state));
    rows.push_back(doctor::pcie_row("d2h pinned", d.d2h_pinned, state));
    rows.push_back(doctor::bandwidth_row("memory", "h2d pageable", d.h2d_pageable, 0, ""));
    rows.push_back(doctor::bandwidth_row("memory", "d2h pageable", d.d2h_pageable, 0, ""));
    for (const auto& p : d.peers) {
      const double expected = state.nvlinks_active > 0
                                  ? 0.0
                                  : doctor::pcie_gbps(state.pcie_max_gen, state.pcie_max_width);
      rows.push_back(doctor::bandwidth_row(
          "interconnect", strprintf("p2p %d->%d", p.from, p.to), p.gbps, expected,
          "peer copies below the PCIe link: enable peer access (IOMMU/ACS settings), check "
          "nvidia-smi topo -m"));
    }
    return;
  }
  // Against one thread's copy: all threads should copy at least as fast.
  doctor::PerfRow copy{"memory", "copy", d.copy_gbps, d.single_thread_copy_gbps, "GB/s"};
  const double ratio = d.single_thread_copy_gbps > 0 ? d.copy_gbps / d.single_thread_copy_gbps : 0;
  copy.verdict = strprintf("%.2fx one thread's", ratio);
  if (ratio > 0 && ratio < doctor::kLowFraction) {
    copy.level = doctor::Level::warn;
    copy.fix = "all threads copy slower than one: other processes or a CPU quota share the cores";
  }
  rows.push_back(copy);
}

// The collectives' rows: bus bandwidth at a few sizes against what the links promise.
void collective_rows(const std::vector<engine::CollectivePerf>& list, int ranks,
                     const std::string& backend, const doctor::GpuState& state,
                     std::vector<doctor::PerfRow>& rows) {
  double link = 0;  // GB/s each rank's links carry, when known
  if (backend == "nccl") {
    link = state.nvlinks_active > 0 ? 25.0 * state.nvlinks_active
                                    : doctor::pcie_gbps(state.pcie_max_gen, state.pcie_max_width);
  }
  for (const auto& c : list) {
    const int64_t largest = list.back().message;
    const bool shown =
        c.message == (int64_t{1} << 20) || c.message == (int64_t{64} << 20) || c.message == largest;
    if (!shown) continue;
    const std::string size = c.message >= (int64_t{1} << 20)
                                 ? strprintf("%" PRId64 "M", c.message >> 20)
                                 : strprintf("%" PRId64 "K", c.message >> 10);
    rows.push_back(doctor::bandwidth_row(
        "interconnect", (c.collective == "all_reduce" ? "allreduce " : "allgather ") + size,
        doctor::bus_gbps(c.collective, static_cast<double>(c.bytes), c.seconds, ranks), 0.8 * link,
        "collectives below the links' rate: NCCL_DEBUG=INFO shows the transport; check "
        "NVLink/IB state and NCCL_* variables"));
  }
}

nlohmann::json rows_json(const std::vector<doctor::PerfRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows) {
    out.push_back({{"group", r.group},
                   {"name", r.name},
                   {"measured", r.measured},
                   {"expected", r.expected},
                   {"unit", r.unit},
                   {"level", doctor::level_name(r.level)},
                   {"verdict", r.verdict},
                   {"fix", r.fix}});
  }
  return out;
}

bool infiniband_devices() {
  std::error_code ec;
  return fs::is_directory("/sys/class/infiniband", ec) &&
         !fs::is_empty("/sys/class/infiniband", ec);
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

// The job's collectives measured, into rows; their figures as JSON.
nlohmann::json collectives(distributed::Group& group, const engine::PerfOptions& options,
                           const distributed::DistEnv& job, const doctor::GpuState& state,
                           std::vector<doctor::PerfRow>& rows) {
  const auto list = engine::measure_collectives(group, options);
  collective_rows(list, group.world_size(), group.backend(), state, rows);
  nlohmann::json all = nlohmann::json::array();
  for (const auto& c : list) {
    all.push_back({{"collective", c.collective},
                   {"message_bytes", c.message},
                   {"bytes", c.bytes},
                   {"seconds", c.seconds},
                   {"busbw_gbps", doctor::bus_gbps(c.collective, static_cast<double>(c.bytes),
                                                   c.seconds, group.world_size())}});
  }
  rows.push_back(doctor::transport_row(job.world_size > job.local_world_size, infiniband_devices(),
                                       env_or("NCCL_NET", ""),
                                       env_or("NCCL_IB_DISABLE", "0") == "1", group.backend()));
  return all;
}

}  // namespace

int doctor_perf(const std::string& config_path, const std::vector<std::string>& overrides,
                bool quick, bool json) {
  const distributed::DistEnv job = distributed::read_process_env();
  engine::PerfOptions options;
  options.quick = quick;
  const bool talk = job.rank == 0;
  if (talk)
    options.progress = [](const std::string& what) { std::cerr << "measuring " << what << "\n"; };
  std::unique_ptr<engine::Trainer> trainer;
  std::unique_ptr<distributed::Group> own_group;
  torch::Device device = torch::cuda::is_available()
                             ? torch::Device(torch::kCUDA, job.launched() ? job.local_rank : 0)
                             : torch::Device(torch::kCPU);
  if (!config_path.empty()) {
    const auto loaded = load_config(config_path, overrides, engine::config_environment());
    trainer = std::make_unique<engine::Trainer>(loaded, job);
    device = trainer->device();
  } else if (job.launched()) {
    distributed::GroupOptions g;
    g.backend = device.is_cuda() ? "nccl" : "gloo";
    g.device = device;
    own_group = std::make_unique<distributed::Group>(job, g);
  }
  distributed::Group* group = trainer ? trainer->group() : own_group.get();
  // The job first: its steps are timed in the state bench times them in, before the device probes
  // below fill the caches and the allocator with their own buffers.
  std::optional<engine::JobPerf> j;
  if (trainer) j = engine::measure_job(*trainer, options);
  const doctor::GpuState state = gpu_state(device);
  std::vector<doctor::PerfRow> rows;
  const auto d = engine::measure_device(device, options);
  device_rows(d, state, rows);
  nlohmann::json report = {{"device", d.name}, {"quick", quick}};
  if (group) report["collectives"] = collectives(*group, options, job, state, rows);
  if (trainer) {
    const std::string root = trainer->config().data.root;
    if (!root.empty()) {
      options.progress("reading " + root);
      rows.push_back(doctor::bandwidth_row("input", "read data.root",
                                           engine::read_gbps(root, options), 0, ""));
    }
    rows.push_back(
        doctor::job_row(j->input_samples_per_sec, j->step_samples_per_sec, j->grad_sync_fraction));
    report["job"] = {{"input_samples_per_sec", j->input_samples_per_sec},
                     {"step_samples_per_sec", j->step_samples_per_sec},
                     {"grad_sync_fraction", j->grad_sync_fraction},
                     {"step_ms_p50", j->step_ms_p50},
                     {"steps", j->steps}};
  }
  if (!talk) return 0;
  report["rows"] = rows_json(rows);
  if (json) {
    std::cout << report.dump(2) << "\n";
  } else {
    std::cout << "device: " << d.name << (d.cuda ? "" : strprintf(", %d threads", d.threads))
              << "\n"
              << doctor::perf_table(rows);
  }
  return 0;
}

}  // namespace trainer::cli
