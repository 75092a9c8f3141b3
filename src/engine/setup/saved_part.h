// A part of the run whose state a checkpoint holds besides the model, the optimizer and the
// counters (the weight average, the spike guard), under its own prefix of tensor names.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace trainer::engine {

class SavedPart {
 public:
  virtual ~SavedPart() = default;

  // The prefix of its tensors' names in a checkpoint ("ema.", "guard.").
  virtual std::string prefix() const = 0;

  // Its whole tensors, named without the prefix; rank 0 writes them. Synchronises nothing.
  virtual checkpoint::NamedTensors tensors() const = 0;

  // With dist.strategy fsdp: this rank's pieces of its sharded tensors, named without the
  // prefix (each rank writes its own; tensors() then holds the rest).
  virtual std::vector<checkpoint::ShardPiece> pieces() const { return {}; }

  // Restores from a checkpoint's tensors under the prefix (the prefix removed; whole tensors,
  // shards assembled). `saved` is empty for a checkpoint written without this part: it starts
  // afresh from the restored model, logged. Throws checkpoint::CorruptCheckpoint naming `path`
  // when a tensor is missing or of another shape.
  virtual void restore(const checkpoint::NamedTensors& saved, const std::string& path) = 0;
};

}  // namespace trainer::engine
