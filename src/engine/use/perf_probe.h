// trainer doctor --perf's measurements: the device's matrix-product rates and memory bandwidths,
// host-device and peer copies, the collectives' bus bandwidth, the data's read rate, and a
// configured job's input and step rates. Each probe is bounded in time; the verdicts are
// doctor/perf.h's. The probes synchronise the device around what they time.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "distributed/process_group.h"
#include "engine/loop/trainer.h"

namespace trainer::engine {

// Called with a short line before each measurement (a progress line).
using Progress = std::function<void(const std::string&)>;

struct PerfOptions {
  bool quick = false;  // smaller sizes and fewer repeats: under 30 s on a GPU server
  Progress progress = [](const std::string&) {};
};

struct DevicePerf {
  std::string name;  // "NVIDIA H200", or the CPU's model name
  bool cuda = false;
  int threads = 0;  // CPU: intra-op threads
  std::vector<std::pair<std::string, double>>
      matmul_tflops;                   // dtype ("fp32", "bf16", ...) -> TFLOP/s
  double single_thread_tflops = 0;     // CPU: float32 matmul on one thread
  double copy_gbps = 0;                // device memory copy, bytes read plus written per second
  double single_thread_copy_gbps = 0;  // CPU: the same on one thread
  // CUDA: host-device copies, GB/s.
  double h2d_pinned = 0, h2d_pageable = 0, d2h_pinned = 0, d2h_pageable = 0;
  struct Peer {
    int from = 0, to = 0;
    double gbps = 0;
  };
  std::vector<Peer> peers;  // CUDA: every ordered pair of visible GPUs
};

// The best seconds of `fn` over `repeats` runs after one untimed, the device synchronised around
// each (reads the device).
double best_seconds(torch::Device device, int repeats, const std::function<void()>& fn);

// Bytes read plus written per second copying a tensor of `bytes` within `device`, as STREAM's
// copy and nvbandwidth count them: 8 copies between two synchronisations, so that neither the
// launch nor the synchronisation is in the figure (reads the device).
double device_copy_gbps(torch::Device device, int64_t bytes, int repeats);

// The matrix-product rates (float32, TF32, bfloat16, float16; on the CPU float32 and bfloat16,
// and float32 on one thread), memory copies and, on CUDA, host-device and peer copies of
// `device`.
DevicePerf measure_device(torch::Device device, const PerfOptions& options);

struct CollectivePerf {
  std::string collective;  // "all_reduce" or "all_gather"
  int64_t message = 0;     // the size probed: 1 KiB, 4 KiB, ...
  int64_t bytes = 0;       // all_reduce: the tensor; all_gather: the gathered output
  double seconds = 0;      // one collective, the slowest rank's mean
};

// all_reduce and all_gather of float32 messages from 1 KiB up to 1 GiB (64 MiB with quick),
// x4 each size, until the probe's time runs out (10 s, 60 s in full): one warm-up, then the mean
// of 5 (messages of 64 MiB and more), 10 (quick) or 20. Every rank must call this, in the same
// order.
std::vector<CollectivePerf> measure_collectives(distributed::Group& group,
                                                const PerfOptions& options);

// Bytes per second reading the files under `root` (a file or a folder, in name order), each
// dropped from the page cache first where the kernel allows (cold-ish), up to 1 GiB (256 MiB
// with quick) or 10 s. 0 when there is nothing to read.
double read_gbps(const std::string& root, const PerfOptions& options);

struct JobPerf {
  double input_samples_per_sec = 0;  // the loader alone, this process
  double step_samples_per_sec = 0;   // training steps on a fixed batch, this process
  double grad_sync_fraction = 0;     // of the step, waiting for gradient all-reduces
  double step_ms_p50 = 0;            // the median of those steps' times, as bench's p50
  int64_t steps = 0;                 // the timed steps of step_samples_per_sec
};

// The training step alone and then the input pipeline alone of `trainer`'s config: the step is
// bench's on a fixed batch, 10 steps after 3 of warm-up, and in one process as many more as fill
// 0.5 s (quick) or 2 s. Every rank must call this, in the same order.
JobPerf measure_job(Trainer& trainer, const PerfOptions& options);

}  // namespace trainer::engine
