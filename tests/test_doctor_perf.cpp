// trainer doctor --perf's verdicts on invented measurements: the spec table, the PCIe and bus
// bandwidth formulas, each verdict and each remedy, and the table's width.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "doctor/perf.h"

namespace trainer::doctor {
namespace {

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(PerfSpecs, NamesMatchTheMostSpecificEntry) {
  EXPECT_DOUBLE_EQ(gpu_spec("NVIDIA H200")->bf16, 989.5);
  EXPECT_DOUBLE_EQ(gpu_spec("NVIDIA H200 NVL")->bf16, 835.5);
  EXPECT_DOUBLE_EQ(gpu_spec("NVIDIA H100 PCIe")->bf16, 756);
  EXPECT_DOUBLE_EQ(gpu_spec("NVIDIA H100 80GB HBM3")->memory_gbps, 3350);
  EXPECT_DOUBLE_EQ(gpu_spec("NVIDIA A100-SXM4-80GB")->memory_gbps, 2039);
  EXPECT_DOUBLE_EQ(gpu_spec("NVIDIA A100-PCIE-40GB")->memory_gbps, 1555);
  EXPECT_DOUBLE_EQ(gpu_spec("NVIDIA A10")->bf16, 125);  // not the A100's
  EXPECT_DOUBLE_EQ(spec_tflops(*gpu_spec("Tesla T4"), "bf16"), 0);
  EXPECT_DOUBLE_EQ(spec_tflops(*gpu_spec("Tesla T4"), "fp16"), 65);
  EXPECT_FALSE(gpu_spec("Some Future GPU").has_value());
  // The dense peaks are half the datasheets' sparsity figures: H200 bf16 1979 -> 989.5.
  for (const auto& s : gpu_specs()) {
    EXPECT_LE(s.tf32, s.bf16) << s.match;
    EXPECT_GT(s.memory_gbps, 0) << s.match;
  }
}

TEST(PerfFormulas, PcieAndBusBandwidth) {
  EXPECT_NEAR(pcie_gbps(5, 16), 3.938 * 16 * 0.87, 1e-9);  // ~54.8 GB/s
  EXPECT_NEAR(pcie_gbps(4, 16), pcie_gbps(5, 16) / 2, 0.1);
  EXPECT_NEAR(pcie_gbps(5, 4), pcie_gbps(5, 16) / 4, 1e-9);
  EXPECT_EQ(pcie_gbps(0, 16), 0);
  // nccl-tests: all_reduce busbw = algbw * 2(n-1)/n, all_gather busbw = algbw * (n-1)/n.
  EXPECT_NEAR(bus_gbps("all_reduce", 1e9, 1.0, 8), 1.75, 1e-12);
  EXPECT_NEAR(bus_gbps("all_gather", 1e9, 0.5, 8), 1.75, 1e-12);
  EXPECT_NEAR(bus_gbps("all_reduce", 1e9, 1.0, 2), 1.0, 1e-12);
  EXPECT_EQ(bus_gbps("all_reduce", 1e9, 1.0, 1), 0);
  EXPECT_EQ(bus_gbps("all_reduce", 1e9, 0.0, 2), 0);
}

TEST(PerfVerdicts, ASlowGpuNamesItsLikelyCauses) {
  GpuState capped;
  capped.power_limit_w = 400;
  capped.max_power_limit_w = 700;
  capped.sm_clock_mhz = 1000;
  capped.max_sm_clock_mhz = 1980;
  auto r = compute_row("bf16", 500, 989.5, &capped);
  EXPECT_EQ(r.level, Level::warn);
  EXPECT_TRUE(has(r.fix, "power capped at 400 of 700 W")) << r.fix;
  EXPECT_TRUE(has(r.fix, "SM clock 1000 of 1980 MHz")) << r.fix;
  GpuState hot;
  hot.clock_event_reasons = 0x40;
  hot.temp_c = 91;
  hot.mig = true;
  r = compute_row("bf16", 500, 989.5, &hot);
  EXPECT_TRUE(has(r.fix, "thermal throttling at 91 C") && has(r.fix, "MIG")) << r.fix;
  const GpuState quiet;
  EXPECT_TRUE(has(compute_row("bf16", 500, 989.5, &quiet).fix, "nvidia-smi"));
  r = compute_row("bf16", 800, 989.5, &capped);
  EXPECT_EQ(r.level, Level::ok);
  EXPECT_EQ(r.verdict, "81% of peak");
  r = compute_row("fp32", 0.05, 0.2, nullptr);  // a CPU at a quarter of its roofline
  EXPECT_EQ(r.level, Level::warn);
  EXPECT_TRUE(has(r.fix, "run.threads")) << r.fix;
  EXPECT_EQ(compute_row("fp8", 100, 0, nullptr).verdict, "no spec");
}

TEST(PerfVerdicts, ANarrowPcieLinkIsNamed) {
  GpuState s;
  s.pcie_gen = 5;
  s.pcie_width = 4;
  s.pcie_max_gen = 5;
  s.pcie_max_width = 16;
  auto r = pcie_row("h2d pinned", 12, s);
  EXPECT_EQ(r.level, Level::warn);
  EXPECT_NEAR(r.expected, 54.8, 0.1);
  EXPECT_TRUE(has(r.fix, "Gen5 x16 expected ~55 GB/s") && has(r.fix, "now Gen5 x4")) << r.fix;
  EXPECT_EQ(pcie_row("h2d pinned", 50, s).level, Level::ok);
  EXPECT_EQ(bandwidth_row("memory", "copy", 10, 0, "x").verdict, "measured");
}

TEST(PerfVerdicts, SocketsBetweenNodesWithInfinibandAreAWarning) {
  EXPECT_EQ(transport_row(true, true, "", true, "nccl").level, Level::warn);
  EXPECT_EQ(transport_row(true, true, "Socket", false, "nccl").level, Level::warn);
  EXPECT_EQ(transport_row(true, true, "", false, "nccl").level, Level::ok);
  EXPECT_EQ(transport_row(false, true, "", true, "nccl").level, Level::ok);   // one node
  EXPECT_EQ(transport_row(true, false, "", false, "gloo").level, Level::ok);  // no IB to use
  EXPECT_EQ(transport_row(true, false, "", false, "gloo").verdict, "gloo over sockets");
}

TEST(PerfVerdicts, WhatBoundsAJob) {
  auto r = job_row(500, 2000, 0.1);
  EXPECT_EQ(r.verdict, "input-bound");
  EXPECT_TRUE(has(r.fix, "data.workers")) << r.fix;
  r = job_row(5000, 2000, 0.5);
  EXPECT_EQ(r.verdict, "communication-bound");
  EXPECT_TRUE(has(r.fix, "50% of the step") && has(r.fix, "dist.bucket_cap_mb")) << r.fix;
  r = job_row(5000, 2000, 0.2);
  EXPECT_EQ(r.verdict, "compute-bound");
  EXPECT_EQ(r.level, Level::ok);
}

TEST(PerfTable, FitsOneHundredColumns) {
  GpuState s;
  s.pcie_max_gen = 5;
  s.pcie_max_width = 16;
  s.pcie_gen = 3;
  s.pcie_width = 4;
  const std::vector<PerfRow> rows = {compute_row("bf16", 123.456789, 989.5, &s),
                                     pcie_row("h2d pinned", 3.3, s), job_row(10, 123456.7, 0.9),
                                     transport_row(true, true, "", true, "nccl")};
  const std::string table = perf_table(rows);
  std::istringstream in(table);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) EXPECT_LE(line.size(), 100u) << line;
  EXPECT_GE(lines, 1 + 4 + 4);  // header, rows, a fix under each warning
  EXPECT_TRUE(has(table, "123.5")) << table;
}

}  // namespace
}  // namespace trainer::doctor
