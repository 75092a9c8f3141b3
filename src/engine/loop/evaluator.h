// Evaluation of the model on the validation split.
#pragma once

#include <cstdint>
#include <functional>

#include "engine/loop/components.h"

namespace trainer::engine {

// One pass over the validation split. Predictions are samples, or tokens for language models.
struct EvalResult {
  double loss = 0.0;      // mean cross-entropy per prediction (no label smoothing)
  double top1 = 0.0;      // fraction of predictions whose target is the arg-max
  double top5 = 0.0;      // fraction whose target is among the 5 highest logits
  double ppl = 0.0;       // perplexity, exp(loss)
  int64_t samples = 0;    // predictions made
  bool sequence = false;  // a language model: predictions are tokens, ppl is the headline
};

// Evaluates the model of `parts` (in eval mode, under autocast when training uses it), each rank
// on its shard of the validation split with the sums all-reduced, then returns the model to
// training mode. Adds the unreadable samples it met to `bad_samples`. Every rank of a group must
// call this, in the same order (an all-reduce); synchronises the device (reads the sums).
// `max_batches` > 0: each rank reads at most that many of its batches (run.eval_batches).
// `progress`, when given, is told after each batch how many of this rank's batches are done, of
// how many.
using EvalProgress = std::function<void(int64_t done, int64_t total)>;
EvalResult evaluate(Components& parts, int64_t& bad_samples, int64_t max_batches = 0,
                    const EvalProgress& progress = nullptr);

// The same over `loader` (e.g. one over the training split) instead of the validation split's.
EvalResult evaluate(Components& parts, data::Loader& loader, int64_t& bad_samples,
                    int64_t max_batches = 0, const EvalProgress& progress = nullptr);

}  // namespace trainer::engine
