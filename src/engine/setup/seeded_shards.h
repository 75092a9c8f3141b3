// A seed-initialised model under fsdp, filled where it is kept: each rank draws every parameter
// again from the generator's state recorded while the model was built (nn/init_replay.h) and keeps
// its shard of it, so that no rank holds the whole model and the shards hold the values one
// process draws.
#pragma once

#include "engine/setup/hf_pretrained.h"
#include "models/model.h"
#include "nn/init_replay.h"

namespace trainer::engine {

// The fill (ParameterFill) of `model`'s parameters by name: those `draws` recorded drawn again,
// whole, one at a time (the last one kept for the next range of it); the others (norm weights,
// biases, whatever the model did not record) their values as built, copied now.
ParameterFill replayed_fill(const models::NetImpl& model, nn::RecordedDraws draws);

}  // namespace trainer::engine
