// How the modules being built on this thread get their parameters' storage.
//
// `unwritten`: a model whose parameters are all about to be overwritten from files (a Hugging
// Face folder streamed into this rank's FSDP shards or tensor-parallel parts,
// engine/setup/hf_pretrained.h) leaves their values unset (torch::empty, memory never written, so
// the operating system gives the process no pages for it) instead of drawing its initialisation.
//
// `shapes_only`: a model built only to be planned (trainer doctor --config, --dry-run) gets its
// parameters on the meta device: shapes and dtypes, no storage at all; the layers that honour it
// (nn::Linear, llama's embedding and output layer) never allocate a parameter, the few others
// (norm weights, buffers) are moved to the meta device once the model is built.
//
// A module that ignores the setting builds as always: only memory differs, never the values
// loaded into it.
#pragma once

namespace trainer::nn {

enum class Deferral {
  none,         // parameters drawn as the module initialises them
  unwritten,    // allocated, never written
  shapes_only,  // on the meta device
};

// The setting for the modules being built on this thread.
inline Deferral& deferral() {
  thread_local Deferral d = Deferral::none;
  return d;
}

// Whether the module being built may leave its parameters' values unset.
inline bool deferred_init() {
  return deferral() != Deferral::none;
}

// Whether the module being built puts its parameters on the meta device.
inline bool shapes_only() {
  return deferral() == Deferral::shapes_only;
}

// Sets deferral() for its lifetime (the model's construction), then restores it.
class DeferredInit {
 public:
  explicit DeferredInit(Deferral d) : before_(deferral()) { deferral() = d; }
  ~DeferredInit() { deferral() = before_; }
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;

 private:
  Deferral before_;
};

}  // namespace trainer::nn
