// Building a model whose parameters are all about to be overwritten from files (a Hugging Face
// folder streamed into this rank's FSDP shards, engine/loop/hf_pretrained.h): a model that honours
// it leaves its parameters' values unset (torch::empty, memory never written, so the operating
// system gives the process no pages for it) instead of drawing its initialisation. Buffers and the
// model's shapes are built as always. A model that ignores it builds as always: only memory
// differs, never the loaded values.
#pragma once

namespace trainer::models {

// Whether the model being built on this thread may leave its parameters' values unset.
inline bool& deferred_init() {
  thread_local bool deferred = false;
  return deferred;
}

// Sets deferred_init() for its lifetime (the model's construction), then restores it.
class DeferredInit {
 public:
  explicit DeferredInit(bool on) : before_(deferred_init()) { deferred_init() = on; }
  ~DeferredInit() { deferred_init() = before_; }
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;

 private:
  bool before_;
};

}  // namespace trainer::models
