// A training step captured once in a graph and replayed (train.cuda_graph): the launch overhead
// of its hundreds of kernels paid once.
//
// After `warmup` steps run eagerly, the step's forward, backward, unscale, clipping, fused
// optimizer update and scaler update are captured over static batch buffers. Each later step
// copies its batches into them, sets the learning rate in a device tensor and replays. Whether to
// skip an update (an inf/NaN loss or gradient) is decided on the device, as the fused kernels'
// found_inf; the decision reaches the host a step late through pinned memory (StepFlags), before
// the next replay, whose learning rate counts the skipped steps. Dropout draws from the default
// CUDA generator, whose state a CUDA graph advances at each replay.
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <vector>

#include "engine/loop/step.h"

namespace trainer::engine {

// Captures work once and replays it.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  // Runs `work` now, before capture (a CUDA graph: on its side stream).
  virtual void warm_up(const std::function<void()>& work) = 0;
  // Records `work` without running it; the first replay runs it.
  virtual void capture(const std::function<void()>& work) = 0;
  virtual void replay() = 0;
};

// Runs the captured work at each replay: GraphedStep's plumbing without a device graph (the
// tests on the CPU).
std::unique_ptr<StepGraph> eager_graph();

// A CUDA graph captured on a side stream of `device`. Throws std::runtime_error when this
// LibTorch was built without CUDA.
std::unique_ptr<StepGraph> cuda_graph(torch::Device device);

class GraphedStep final : public Stepper {
 public:
  // The optimizer must take KernelInputs (optim.impl fused) and the job be one process.
  // `guard`: train.skip_update_zscore's, or null (its check is captured with the step).
  GraphedStep(Components& parts, const config::TrainConfig& train, TrainingState& state,
              std::unique_ptr<StepGraph> graph, int64_t warmup = 3, SpikeGuard* guard = nullptr);

  // The first `warmup` steps of this process run eagerly (also after a resume); the step after
  // them captures, every step replays. The batches
  // must have the shapes of the first replayed step's. `observer` sees the replay as the forward
  // phase. Reads the previous step's flags from pinned memory (waiting for their copy) before the
  // replay.
  Settled run(const std::vector<data::Batch>& micro_batches, bool stop_requested,
              StepObserver* observer) override;
  std::vector<StepOutcome> settle() override;
  const torch::Tensor& last_loss() const override;

 private:
  // Copies `micro_batches` into the static buffers (made at the first call).
  void copy_in(const std::vector<data::Batch>& micro_batches);
  // What the graph captures: forward, backward, the skip flag, clipping, update, scaler update.
  void work();

  Components& parts_;
  const config::TrainConfig& train_;
  TrainingState& state_;
  SpikeGuard* guard_;
  std::unique_ptr<StepGraph> graph_;
  int64_t warmup_;
  int64_t eager_steps_ = 0;  // eager warm-up steps run by this process
  TrainStep eager_;
  bool captured_ = false;
  std::vector<data::Batch> static_;  // the static batches on the device
  torch::Tensor lr_;                 // float32 learning rate on the device, set before each replay
  StepFlags flags_;                  // the skip decision, computed by each replay
  torch::Tensor loss_;               // written by each replay: the mean loss
  StepFlags::Decision decided_;      // and the decision (the window's loss and gradient norm)
};

}  // namespace trainer::engine
