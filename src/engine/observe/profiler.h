// Kineto traces of training steps (the `profile:` section, `trainer bench --profile DIR`):
// LibTorch's profiler, the C++ side of torch.profiler, recording ATen operators (with their shapes
// when asked), on a GPU also CUDA kernels and copies, and the trainer's phases as named ranges;
// written as Chrome-trace JSON that Perfetto and chrome://tracing open, with a summary table of the
// operators by self time.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/setup/results.h"

namespace trainer::engine {

struct ProfileOptions {
  bool record_shapes = false;  // operators' input shapes in the trace
  bool with_stack = false;     // call stacks where LibTorch records them (TorchScript)
  bool memory = false;         // allocations and frees ([memory] events)
};

// One operator (or named range) of a profile, summed over its calls.
struct ProfiledOp {
  std::string name;
  int64_t calls = 0;
  double self_cpu_us = 0;   // its own host time, without the operators it called
  double cpu_us = 0;        // with them
  double self_cuda_us = 0;  // the device time of the kernels and copies it launched itself
};

// What a profile recorded, per step.
struct ProfileSummary {
  int64_t steps = 0;
  std::vector<ProfiledOp> ops;                          // by self CPU time, largest first
  std::vector<std::pair<std::string, double>> kernels;  // device microseconds per kernel name,
                                                        // largest first (a GPU)
  double top_level_ops = 0;  // ATen operators per step entered from no other operator (what
                             // engine::OpCount counts)
  double cuda_us = 0;        // device time of all kernels and copies per step

  // A table like torch.profiler's key_averages().table(): the `rows` largest by self CPU time,
  // then the kernels by device time.
  std::string table(size_t rows = 25) const;
};

// Records the steps between start() and stop() on this thread and the autograd threads it starts.
// One profile at a time in a process.
class StepProfiler {
 public:
  StepProfiler(const ProfileOptions& options, torch::Device device);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  void start();
  // Stops recording, writes the Chrome trace to `trace_path` (atomically; the folder must exist;
  // its `traceName` the path, without the GPU probe's error of a machine without a GPU) and
  // summarises `steps` recorded steps. Throws std::runtime_error when the trace cannot be
  // written.
  ProfileSummary stop(const std::string& trace_path, int64_t steps);

  bool recording() const { return recording_; }

 private:
  ProfileOptions options_;
  torch::Device device_;
  bool recording_ = false;
};

// Names each step in the trace as torch.profiler's schedule does (a range `ProfilerStep#<step>`
// per step, numbered from `first_step`, which HTA and TensorBoard's profiler view read) and each
// phase within it (a range per phase: data, forward, backward, grad_sync, optimizer), passing every
// call on to `inner` (may be null).
class PhaseRanges final : public StepObserver {
 public:
  explicit PhaseRanges(StepObserver* inner = nullptr, int64_t first_step = 1);
  ~PhaseRanges() override;
  void begin_step() override;
  void begin(Phase phase) override;
  void end_step(const torch::Tensor& loss) override;

 private:
  struct Range;
  StepObserver* inner_;
  int64_t next_step_;
  std::string step_name_;  // the open step range's name (the range refers to it)
  std::unique_ptr<Range> step_range_;
  std::unique_ptr<Range> range_;
};

}  // namespace trainer::engine
