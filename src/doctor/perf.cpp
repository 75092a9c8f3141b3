#include "doctor/perf.h"

#include <algorithm>
#include <cstdio>

#include "util/format.h"
#include "util/strings.h"

namespace trainer::doctor {

const std::vector<GpuSpec>& gpu_specs() {
  // Dense tensor-core peaks (the datasheets' sparsity figures halved), boost clocks.
  static const std::vector<GpuSpec> table = {
      // NVIDIA H200 Tensor Core GPU datasheet (2024), H200 NVL column.
      {"H200 NVL", 60, 417.5, 835.5, 835.5, 1670.5, 4800},
      // The same datasheet, H200 SXM column.
      {"H200", 67, 494.7, 989.5, 989.5, 1979, 4800},
      // NVIDIA H100 Tensor Core GPU datasheet (2023), H100 NVL column.
      {"H100 NVL", 60, 417.5, 835.5, 835.5, 1670.5, 3900},
      // The same datasheet, H100 PCIe column.
      {"H100 PCIe", 51, 378, 756, 756, 1513, 2000},
      // The same datasheet, H100 SXM column.
      {"H100", 67, 494.7, 989.5, 989.5, 1979, 3350},
      // NVIDIA A100 Tensor Core GPU datasheet (2021): 80GB SXM, 80GB PCIe, 40GB.
      {"A100-SXM4-80GB", 19.5, 156, 312, 312, 0, 2039},
      {"A100 80GB PCIe", 19.5, 156, 312, 312, 0, 1935},
      {"A100", 19.5, 156, 312, 312, 0, 1555},
      // NVIDIA L40S datasheet (2023).
      {"L40S", 91.6, 183, 362, 362, 733, 864},
      // NVIDIA L4 datasheet (2023).
      {"L4", 30.3, 60, 121, 121, 242.5, 300},
      // NVIDIA A10 datasheet (2021).
      {"A10", 31.2, 62.5, 125, 125, 0, 600},
      // NVIDIA Ada Lovelace architecture whitepaper, appendix table 2 (FP32 accumulation).
      {"RTX 4090", 82.6, 82.6, 165.2, 165.2, 330.3, 1008},
      // NVIDIA T4 datasheet (2019): no TF32 or bfloat16 tensor cores.
      {"T4", 8.1, 0, 0, 65, 0, 320},
      // NVIDIA V100 datasheet (2020), SXM2.
      {"V100", 15.7, 0, 0, 125, 0, 900},
  };
  return table;
}

std::optional<GpuSpec> gpu_spec(const std::string& name) {
  for (const auto& s : gpu_specs()) {
    if (name.find(s.match) != std::string::npos) return s;
  }
  return std::nullopt;
}

double spec_tflops(const GpuSpec& spec, const std::string& dtype) {
  if (dtype == "fp32") return spec.fp32;
  if (dtype == "tf32") return spec.tf32;
  if (dtype == "bf16") return spec.bf16;
  if (dtype == "fp16") return spec.fp16;
  if (dtype == "fp8") return spec.fp8;
  return 0;
}

double pcie_gbps(int gen, int width) {
  // GB/s a lane after line encoding (8b/10b up to Gen2, 128b/130b after).
  static const double kLane[] = {0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.877};
  if (gen < 1 || gen > 6 || width <= 0) return 0;
  return kLane[gen] * width * 0.87;
}

double bus_gbps(const std::string& collective, double bytes, double seconds, int ranks) {
  if (seconds <= 0 || ranks < 1) return 0;
  const double algbw = bytes / seconds / 1e9;
  const double n = ranks;
  return collective == "all_reduce" ? algbw * 2 * (n - 1) / n : algbw * (n - 1) / n;
}

std::string slow_gpu_causes(const GpuState& s) {
  std::vector<std::string> causes;
  if (s.mig) causes.push_back("MIG is on (this process sees one slice)");
  if (s.max_sm_clock_mhz > 0 && s.sm_clock_mhz > 0 && s.sm_clock_mhz < 0.8 * s.max_sm_clock_mhz) {
    causes.push_back(strprintf("SM clock %d of %d MHz", s.sm_clock_mhz, s.max_sm_clock_mhz));
  }
  if (s.max_power_limit_w > 0 && s.power_limit_w < 0.9 * s.max_power_limit_w) {
    causes.push_back(strprintf("power capped at %.0f of %.0f W (nvidia-smi -pl)", s.power_limit_w,
                               s.max_power_limit_w));
  }
  // NVML's clocks-event reasons: 0x20 software thermal, 0x40 hardware thermal, 0x80 power brake,
  // 0x4 software power cap.
  if (s.clock_event_reasons & 0x60)
    causes.push_back(strprintf("thermal throttling at %.0f C", s.temp_c));
  if (s.clock_event_reasons & 0x84) causes.push_back("power throttling");
  return causes.empty() ? "check clocks, power cap and cooling with nvidia-smi -q -d CLOCK,POWER"
                        : join(causes, "; ");
}

PerfRow compute_row(const std::string& dtype, double measured, double expected,
                    const GpuState* state) {
  PerfRow r{"compute", "matmul " + dtype, measured, expected, "TFLOP/s"};
  if (expected <= 0) {
    r.verdict = "no spec";
    return r;
  }
  if (measured >= kLowFraction * expected) {
    r.verdict = strprintf("%.0f%% of peak", 100 * measured / expected);
    return r;
  }
  r.level = Level::warn;
  r.verdict = strprintf("%.0f%% of peak", 100 * measured / expected);
  r.fix = state ? slow_gpu_causes(*state)
                : "other processes share the cores, or fewer cores than expected are usable "
                  "(run.threads, taskset, the container's CPU quota)";
  return r;
}

PerfRow bandwidth_row(const std::string& group, const std::string& what, double measured,
                      double expected, const std::string& fix) {
  PerfRow r{group, what, measured, expected, "GB/s"};
  if (expected <= 0) {
    r.verdict = "measured";
    return r;
  }
  r.verdict = strprintf("%.0f%% of expected", 100 * measured / expected);
  if (measured < kLowFraction * expected) {
    r.level = Level::warn;
    r.fix = fix;
  }
  return r;
}

PerfRow pcie_row(const std::string& what, double measured, const GpuState& s) {
  const double expected = pcie_gbps(s.pcie_max_gen, s.pcie_max_width);
  std::string fix = strprintf(
      "Gen%d x%d expected ~%.0f GB/s: the GPU sits in a narrower slot or its link is degraded "
      "(now Gen%d x%d); reseat it or use an x16 slot",
      s.pcie_max_gen, s.pcie_max_width, expected, s.pcie_gen, s.pcie_width);
  return bandwidth_row("memory", what, measured, expected, fix);
}

PerfRow transport_row(bool multi_node, bool infiniband, const std::string& nccl_net,
                      bool ib_disabled, const std::string& backend) {
  PerfRow r{"interconnect", "transport", 0, 0, ""};
  const bool sockets = backend == "gloo" || nccl_net == "Socket" || ib_disabled;
  r.verdict = backend + (sockets ? " over sockets" : "");
  if (multi_node && infiniband && sockets) {
    r.level = Level::warn;
    r.fix =
        "InfiniBand devices exist (/sys/class/infiniband) but the job uses sockets: unset "
        "NCCL_IB_DISABLE and NCCL_NET=Socket, use the nccl backend";
  }
  return r;
}

PerfRow job_row(double input_sps, double step_sps, double grad_sync_fraction) {
  PerfRow r{"job", "input/step", input_sps, step_sps, "samples/s"};
  if (input_sps < step_sps) {
    r.level = Level::warn;
    r.verdict = "input-bound";
    r.fix = strprintf(
        "the input gives %.0f samples/s, the step runs at %.0f: more data.workers, faster "
        "storage or data in memory, smaller images on disk",
        input_sps, step_sps);
  } else if (grad_sync_fraction > 1.0 / 3.0) {
    r.level = Level::warn;
    r.verdict = "communication-bound";
    r.fix = strprintf(
        "%.0f%% of the step waits for gradient all-reduces: larger dist.bucket_cap_mb, "
        "bfloat16 (amp), gradient accumulation, a faster interconnect",
        100 * grad_sync_fraction);
  } else {
    r.verdict = "compute-bound";
  }
  return r;
}

namespace {

// `text` in lines of at most `width` characters, each after `indent`.
std::string wrapped(const std::string& text, size_t width, const std::string& indent) {
  std::string out, line;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += indent + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    start = end + 1;
  }
  if (!line.empty()) out += indent + line + "\n";
  return out;
}

}  // namespace

std::string perf_table(const std::vector<PerfRow>& rows) {
  // 12 + 16 + 10 + 10 + 9 columns and their spaces: the verdict starts at column 62.
  std::string out = strprintf("%-12s %-16s %10s %10s %-9s %s\n", "group", "what", "measured",
                              "expected", "unit", "verdict");
  for (const auto& r : rows) {
    const std::string measured = r.unit.empty() ? "" : strprintf("%.4g", r.measured);
    const std::string expected = r.unit.empty()   ? ""
                                 : r.expected > 0 ? strprintf("%.4g", r.expected)
                                                  : "-";
    const std::string verdict = std::string(level_name(r.level)) + " " + r.verdict;
    out += strprintf("%-12s %-16s %10s %10s %-9s %s\n", r.group.c_str(), r.name.c_str(),
                     measured.c_str(), expected.c_str(), r.unit.c_str(),
                     verdict.substr(0, 38).c_str());
    if (!r.fix.empty()) out += wrapped("-> " + r.fix, 94, "  ");
  }
  return out;
}

}  // namespace trainer::doctor
