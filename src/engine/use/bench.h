// `trainer bench`: timed training steps of a configured run, where their time goes, the memory
// they take and the FLOP rate they reach.
#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "engine/loop/trainer.h"
#include "engine/measure/flops.h"  // matmul_peak_tflops

namespace trainer::engine {

struct BenchOptions {
  int64_t steps = 50;        // timed steps
  int64_t warmup = 10;       // untimed steps before them
  bool fixed_batch = false;  // every step on the first batch, kept on the device (no loader)
  int64_t counted = 3;       // steps after the timed ones whose operators are counted
  std::string profile_dir;   // non-empty: `profiled` more steps recorded by Kineto into
                             // <profile_dir>/rank_<N>.trace.json
  int64_t profiled = 3;
  bool profile_shapes = false;  // the profiled operators' input shapes
};

// Milliseconds per step over the timed steps.
struct StepTimes {
  double mean = 0, p50 = 0, p90 = 0, max = 0;
};

struct BenchResult {
  std::string device_name;     // the CPU's or GPU's product name
  double seconds = 0;          // wall time of the timed steps (device work finished)
  double samples_per_sec = 0;  // of the whole job: every rank's samples
  double tokens_per_sec = 0;   // language models; 0 for other data
  StepTimes step_ms;           // this process's steps: CUDA events on a GPU, the clock on CPU
  std::array<double, kPhaseCount> phase_ms{};  // mean milliseconds per step in each Phase
  double peak_memory_mb = 0;     // CUDA: caching-allocator peak of the timed steps; CPU: peak RSS
  std::string peak_memory_kind;  // "cuda_allocator" or "cpu_rss"
  int64_t flops_per_step = 0;    // model FLOPs of one step of this process: 3 x forward
  double tflops = 0;             // flops_per_step per mean step time
  double peak_tflops = 0;        // the device's measured matrix-product rate in the compute dtype
  double mfu = 0;                // tflops / peak_tflops
  double final_loss = 0;         // the last timed step's loss (this process's)
  // ATen operators dispatched per optimizer step (top-level, engine/measure/op_count.h), by phase:
  // forward, backward, optimizer, other (data, gradient sync, the step's bookkeeping); and the
  // host reads per step. Counted over BenchOptions::counted untimed steps.
  std::map<std::string, double> ops_per_step;
  std::map<std::string, std::map<std::string, double>>
      ops_by_name;  // phase -> operator -> per step
  double host_syncs_per_step = 0;
  HeldState held;             // this rank's parameters, gradients and optimizer state
  std::string profile_trace;  // the Chrome trace written (BenchOptions::profile_dir)
  std::string profile_table;  // its summary: operators by self time, kernels by time
  double profiled_ops_per_step = 0;
  int64_t activation_offload_bytes_per_step = 0;  // model.checkpointing: offload, timed steps  //
                                                  // top-level ATen operators per profiled step
  double comm_bytes_per_step = 0;  // this rank's collectives' payload per timed step (fsdp:
                                   // all-gathers and reduce-scatters; ddp: the gradients'
                                   // all-reduce, each gradient once; the steps' own small ones;
                                   // 0 alone)
  std::map<std::string, double> comm_by_kind;  // the same by kind: all_reduce, all_gather,
                                               // reduce_scatter, broadcast
};

// Runs options.warmup untimed then options.steps timed training steps of `trainer`. In a
// launched job every rank must run it, in the same order; the figures are this process's but for
// the job's throughput. Synchronises the device before and after the timed steps.
BenchResult run_bench(Trainer& trainer, const BenchOptions& options);

// The CPU's model name, or the GPU's product name as NVML reports it.
std::string device_name(torch::Device device);

// Waits for the device's queued work (nothing on the CPU). Synchronises the device.
void synchronize(torch::Device device);

// "data", "forward", "backward", "grad_sync", "optimizer".
const char* phase_name(Phase phase);

}  // namespace trainer::engine
