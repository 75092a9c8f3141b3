// The CUDA implementation of StepGraph (engine/loop/graphed_step.h): at::cuda::CUDAGraph, captured
// on a side stream as torch.cuda.graph does.
#include "engine/loop/graphed_step.h"

#include <stdexcept>

#ifdef TRAINER_WITH_CUDA
// The generic stream guard, event and device synchronisation dispatch through LibTorch's
// registered CUDA guard: this file calls no CUDA runtime function itself (the binary links
// LibTorch's CUDA libraries, never the toolkit's runtime directly).
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainer::engine {

#ifdef TRAINER_WITH_CUDA
namespace {

class CudaGraph final : public StepGraph {
 public:
  explicit CudaGraph(torch::Device device)
      : index_(device.has_index() ? device.index() : 0),
        side_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index_)) {}

  void warm_up(const std::function<void()>& work) override { on_side_stream(work); }

  void capture(const std::function<void()>& work) override {
    c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->synchronizeDevice(index_);
    on_side_stream([&] {
      // Thread-local capture: the loader's threads may pin memory and copy meanwhile (global mode
      // would make their CUDA calls invalidate the capture); this thread makes none but the
      // step's own.
      graph_.capture_begin(/*pool=*/{0, 0}, cudaStreamCaptureModeThreadLocal);
      work();
      graph_.capture_end();
    });
  }

  void replay() override { graph_.replay(); }

 private:
  // Runs `work` on the side stream after the current stream's queued work; the current stream
  // then waits for it.
  void on_side_stream(const std::function<void()>& work) {
    const auto current = c10::cuda::getCurrentCUDAStream(index_);
    c10::Event queued(c10::DeviceType::CUDA);
    queued.record(current.unwrap());
    queued.block(side_.unwrap());
    {
      c10::StreamGuard guard(side_.unwrap());
      work();
    }
    c10::Event done(c10::DeviceType::CUDA);
    done.record(side_.unwrap());
    done.block(current.unwrap());
  }

  c10::DeviceIndex index_;
  c10::cuda::CUDAStream side_;
  at::cuda::CUDAGraph graph_;
};

}  // namespace

std::unique_ptr<StepGraph> cuda_graph(torch::Device device) {
  return std::make_unique<CudaGraph>(device);
}
#else
std::unique_ptr<StepGraph> cuda_graph(torch::Device /*device*/) {
  throw std::runtime_error("train.cuda_graph: this LibTorch was built without CUDA");
}
#endif

}  // namespace trainer::engine
