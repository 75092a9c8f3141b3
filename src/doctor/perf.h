// trainer doctor --perf: what a server should reach (its specification), and pure functions that
// turn measurements into rows of measured vs expected with a verdict and a fix, testable with
// invented numbers. The measuring is engine/use/perf_probe.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "doctor/findings.h"
#include "util/gpu_monitor.h"

namespace trainer::doctor {

// A GPU model's datasheet figures: dense (no sparsity) peak TFLOP/s per dtype, 0 where the GPU
// has no such tensor-core path, and the memory bandwidth.
struct GpuSpec {
  const char* match;  // a substring of the device name, e.g. "H200"
  double fp32 = 0, tf32 = 0, bf16 = 0, fp16 = 0, fp8 = 0;  // TFLOP/s
  double memory_gbps = 0;                                  // GB/s (10^9 bytes)
};

// The spec table, most specific names first (each entry's source is a comment beside it).
const std::vector<GpuSpec>& gpu_specs();

// The entry of the GPU named `name` (as CUDA or NVML names it), if the table has it.
std::optional<GpuSpec> gpu_spec(const std::string& name);

// The peak of `dtype` ("fp32", "tf32", "bf16", "fp16", "fp8") in a spec; 0 when it has none.
double spec_tflops(const GpuSpec& spec, const std::string& dtype);

// What a PCIe link of generation `gen` and `width` lanes carries in one direction, in GB/s, as
// a copy of pinned memory reaches it: the line rate after encoding, times 0.87 for the protocol
// (Gen5 x16: 3.94 GB/s a lane x 16 x 0.87 = 54.8 GB/s). 0 for an unknown generation.
double pcie_gbps(int gen, int width);

// nccl-tests' bus bandwidth: the algorithm bandwidth (bytes / seconds) times what each rank's
// links carry of it. all_reduce: 2 (n - 1) / n; all_gather (bytes = the gathered size):
// (n - 1) / n.
double bus_gbps(const std::string& collective, double bytes, double seconds, int ranks);

// One row of the report.
struct PerfRow {
  PerfRow() = default;
  PerfRow(std::string group, std::string name, double measured, double expected, std::string unit)
      : group(std::move(group)),
        name(std::move(name)),
        measured(measured),
        expected(expected),
        unit(std::move(unit)) {}

  std::string group;    // "compute", "memory", "interconnect", "input", "job"
  std::string name;     // e.g. "matmul bf16", "h2d pinned"
  double measured = 0;  // in `unit`
  double expected = 0;  // in `unit`; 0 = no expectation
  std::string unit;     // "TFLOP/s", "GB/s", "samples/s"
  Level level = Level::ok;
  std::string verdict;  // a few words: "ok", "below spec", "input-bound", ...
  std::string fix;      // one line; empty when ok
};

// Fraction of the expected value below which a row is a warning.
constexpr double kLowFraction = 0.7;

// What a healthy card's device-to-device copy reaches of its datasheet memory bandwidth (bytes
// read plus written): about 0.9 on H100 and H200 (an H200 copies about 4.3 of 4.8 TB/s), as
// STREAM-like copies of buffers far larger than the cache measure it.
constexpr double kCopyOfSpec = 0.9;

// NVML's view of one GPU (clocks, power limits, clock-event reasons, MIG, PCIe link, NVLinks),
// for the causes of a low compute figure.
using GpuState = GpuMonitor::Limits;

// The likely causes of a GPU below its peak, from its state (clocks, power cap, thermal, MIG).
std::string slow_gpu_causes(const GpuState& state);

// A measured matmul rate against the peak of its dtype (`expected` 0: no spec, reported alone).
PerfRow compute_row(const std::string& dtype, double measured_tflops, double expected_tflops,
                    const GpuState* state);

// A bandwidth against what it should reach; `what` names the row ("device copy", "h2d pinned"),
// `fix` is what to do when it is low.
PerfRow bandwidth_row(const std::string& group, const std::string& what, double measured_gbps,
                      double expected_gbps, const std::string& fix);

// A host-device copy against the PCIe link NVML reports, naming a degraded or narrow link.
PerfRow pcie_row(const std::string& what, double measured_gbps, const GpuState& state);

// The transport a job's collectives should use: a warning when ranks on several nodes talk over
// sockets while InfiniBand devices exist.
PerfRow transport_row(bool multi_node, bool infiniband_devices, const std::string& nccl_net,
                      bool nccl_ib_disable, const std::string& backend);

// Which side limits a training job, from the input pipeline's samples/s alone, the training
// step's samples/s alone (on a fixed batch) and the share of the step waiting for gradient
// all-reduces: input-bound when the input cannot keep up, communication-bound when the wait is
// over a third of the step, else compute-bound; each with its remedy. The row's measured value
// is the input's rate, its expected value the step's.
PerfRow job_row(double input_samples_per_sec, double step_samples_per_sec,
                double grad_sync_fraction);

// The report as a table that fits 100 columns.
std::string perf_table(const std::vector<PerfRow>& rows);

}  // namespace trainer::doctor
