// A seed-initialised model's draws made again where its values are kept, so that no process holds
// the whole model and every part holds the values a plain build draws.
//
// While an InitReplay is alive on a thread, a model built there records instead of keeping the
// weights it draws through normal_or_record (llama's and gpt's initialisation: every matrix
// N(0, std)): each such parameter is left unwritten (memory the operating system has not given
// yet) and the CPU generator's state before its draw is recorded; the generator is then moved past
// the draw exactly as a plain build moves it (the same draw is made into a temporary and dropped),
// so that whatever is drawn after is a plain build's. redraw() gives a recorded parameter's values
// again, equal to the plain build's: FSDP fills each rank's shards from them
// (engine/setup/seeded_shards.h). A model that draws otherwise builds as always: nothing is
// recorded and its parameters hold their values.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <map>

namespace trainer::nn {

struct RecordedDraw {
  at::Tensor generator_state;  // the CPU generator's state before the draw
  c10::ScalarType dtype = at::kFloat;
  double mean = 0, std = 1;  // normal_(mean, std)
};

// By the parameter's TensorImpl (which set_data keeps).
using RecordedDraws = std::map<const void*, RecordedDraw>;

// For its lifetime, models built on this thread record their draws (replaying()).
class InitReplay {
 public:
  InitReplay();
  ~InitReplay();
  InitReplay(const InitReplay&) = delete;
  InitReplay& operator=(const InitReplay&) = delete;

  // The draws recorded so far, handed over.
  RecordedDraws take();

 private:
  friend void normal_or_record(torch::Tensor& p, double mean, double std);
  InitReplay* before_;
  RecordedDraws draws_;
};

// Whether a model being built on this thread records its draws (an InitReplay is alive).
bool replaying();

// p.normal_(mean, std); while replaying(), instead: the draw recorded for `p`, the CPU generator
// moved past it, `p` given unwritten memory of its shape (what it held freed).
void normal_or_record(torch::Tensor& p, double mean, double std);

// Each matrix (2-D parameter) of `module` given unwritten memory of its shape, what it held (the
// layers' own draws) freed: for a model whose initialisation then draws every matrix again through
// normal_or_record, called while replaying() as each block is built, so that the blocks' draws
// never add up.
void release_matrices(torch::nn::Module& module);

// The values `draw` gave a tensor of `sizes`: drawn again from the recorded state on the CPU; the
// generator's state restored after.
at::Tensor redraw(const RecordedDraw& draw, at::IntArrayRef sizes);

}  // namespace trainer::nn
