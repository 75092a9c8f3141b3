// Evaluation of the model on the validation split.
#pragma once

#include <cstdint>
#include <functional>

#include "engine/setup/components.h"
#include "engine/setup/results.h"

namespace trainer::engine {

// Evaluates the model of `parts` (in eval mode, under autocast when training uses it), each rank
// on its shard of the validation split with the sums all-reduced, then returns the model to
// training mode. Adds the unreadable samples it met to `bad_samples`. Every rank of a group must
// call this, in the same order (an all-reduce); synchronises the device (reads the sums).
// `max_batches` > 0: each rank reads at most that many of its batches (run.eval_batches).
// `progress`, when given, is told after each batch how many of this rank's batches are done, of
// how many.
EvalResult evaluate(Components& parts, int64_t& bad_samples, int64_t max_batches = 0,
                    const EvalProgress& progress = nullptr);

// The same over `loader` (e.g. one over the training split) instead of the validation split's.
EvalResult evaluate(Components& parts, data::Loader& loader, int64_t& bad_samples,
                    int64_t max_batches = 0, const EvalProgress& progress = nullptr);

}  // namespace trainer::engine
