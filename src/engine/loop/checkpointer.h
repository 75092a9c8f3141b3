// Training checkpoints: the whole state of a run saved in <run.dir>/checkpoints and restored from
// there, so that a resumed run continues exactly as if never interrupted.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/loader.h"
#include "distributed/env.h"
#include "engine/loop/async_writer.h"
#include "engine/loop/components.h"
#include "engine/loop/evaluator.h"
#include "engine/loop/saved_part.h"
#include "engine/loop/state.h"

namespace trainer::engine {

// The model weights in a checkpoint the trainer wrote, under their state-dict names.
checkpoint::NamedTensors model_weights(const checkpoint::State& ckpt);

// Whether the data's labels are used with a checkpoint's model: for training and scoring they
// must mean the classes the model was trained on; prediction names the model's own.
enum class LabelUse { train_and_score, none };

// Which of a checkpoint's weights a model takes: the average (train.ema) where the checkpoint
// holds one, else the trained ones; the trained ones; or the average (an error without one).
enum class WeightsUse { average_if_saved, trained, average };

// Saves and restores the model, the optimizer's state, the RNGs, the gradient scaler and the
// TrainingState, keeping run.keep_last checkpoints and the best by run.keep_best. Only rank 0
// writes, every rank holding the same state; with dist.strategy fsdp each rank writes its shards
// of the parameters and optimizer state too (checkpoint::write_shard), and a checkpoint loads on
// any number of ranks under either strategy. With run.checkpoint_async a save copies the state to
// host memory and writes it on a background thread while training goes on (checkpointer_save.cpp).
class Checkpointer {
 public:
  // The name prefixes of the model's and the optimizer's tensors in a checkpoint.
  static constexpr const char* kModelPrefix = "model.";
  static constexpr const char* kOptimPrefix = "optim.";

  // `extras`: the run's other saved parts (the weight average, the spike guard).
  Checkpointer(const config::LoadedConfig& loaded, Components& parts, TrainingState& state,
               const distributed::DistEnv& job, std::vector<SavedPart*> extras = {});

  // Continues from a checkpoint: "auto" takes the newest one of <run.dir>/checkpoints that
  // verifies (returns false, a fresh start, when there is none); a run dir, the newest of its
  // checkpoints/ that verifies (config::ConfigError when it has none); anything else is a
  // checkpoint file. Throws config::ConfigError when the checkpoint belongs to another model or
  // optimizer, checkpoint::CorruptCheckpoint for a damaged file. Every rank must call this, in the
  // same order (rank 0 picks the file and broadcasts its name).
  bool resume(const std::string& spec);

  // Loads only the model weights (and class names) of the checkpoint file `path` (verified, its
  // config checked as resume() checks it) and returns the step it was written at: for
  // evaluation, on any number of ranks. Each rank reads the file itself. With `labels`
  // train_and_score, the data's class names must be the checkpoint's (data.remap_classes maps
  // them by name), else config::ConfigError; with none (prediction) the checkpoint's names are
  // taken.
  // `loaded`: the file's state, read already (a run dir's newest checkpoint that verified, which
  // a running training may prune meanwhile).
  // `weights`: which of its weights (config::ConfigError naming `path` for `average` when it
  // holds none).
  int64_t load_model(const std::string& path, LabelUse labels = LabelUse::train_and_score,
                     const checkpoint::State* loaded = nullptr,
                     WeightsUse weights = WeightsUse::trained);

  // train.rollback_on_nan: goes back to the newest checkpoint (last()) after a bad step, keeping
  // the data's position. The model, optimizer, scaler, RNGs and saved parts become the
  // checkpoint's; the step count stays, the steps since the checkpoint counted as skipped (so
  // the schedule's clock is the checkpoint's again) and as rolled back; the metrics window
  // starts afresh. Returns the checkpoint's step. Every rank must call this, in the same order.
  int64_t rollback();

  // Saves the state of the current step unless it is saved already, with `eval`'s metrics when
  // it was evaluated at this step. A failed save stops the run (throws) unless
  // run.continue_on_save_error; the previous checkpoint stays intact either way. Every rank must
  // call this, in the same order (the metrics window is averaged and rank 0's outcome
  // broadcast).
  void save(const EvalResult& eval);

  // run.checkpoint_async: waits for the checkpoint being written in the background and settles
  // its outcome as save() does for a synchronous one (a failure throws unless
  // run.continue_on_save_error); nothing when no write is in flight. save(), rollback() and the
  // end of a run call it. Every rank must call this, in the same order.
  void wait();

  // The newest checkpoint written or resumed from; "" when none.
  const std::string& last() const { return last_; }
  // The step of the newest checkpoint written or resumed from, known to every rank; -1 when none.
  int64_t saved_step() const { return saved_step_; }
  // The step of the checkpoint resumed from; -1 for a fresh run.
  int64_t resumed_step() const { return resumed_step_; }

 private:
  // How many samples a step takes: the ranks, each rank's batch, the micro-batches.
  struct DataPosition {
    int world_size = 1;
    int64_t batch_size = 1;
    int64_t grad_accum_steps = 1;
    int64_t global_batch() const { return world_size * batch_size * grad_accum_steps; }
  };
  // This job's, and the one a checkpoint was written with (older checkpoints: its config's batch
  // settings at this job's world size).
  DataPosition position_now() const;
  DataPosition saved_position(const nlohmann::json& meta, const std::string& path) const;
  // What differs between `then` and `now`, and what to set.
  static std::string position_mismatch(const DataPosition& then, const DataPosition& now,
                                       const std::string& path);

  // The state to save, which rank 0 writes. With tensor parallelism under ddp every rank of rank
  // 0's tensor-parallel group must call this, in the same order (the split tensors are joined
  // over the group): snapshots_here().
  checkpoint::State snapshot() const;
  bool snapshots_here() const {
    return job_.rank == 0 || (parts_.tp && !parts_.fsdp && parts_.data_group()->rank() == 0);
  }
  // A checkpoint's whole tensors as this rank holds them (its parts of the split ones).
  checkpoint::State for_this_rank(const checkpoint::State& ckpt) const;
  void restore(const checkpoint::State& whole, const std::string& path);
  void check_config(const nlohmann::json& saved, const std::string& path) const;
  void restore_model(const checkpoint::State& ckpt, const std::string& path, LabelUse labels,
                     WeightsUse weights = WeightsUse::trained);
  // The class names in a checkpoint's metadata (none in older ones); CorruptCheckpoint when they
  // are not a list of names, one per model output.
  std::vector<std::string> saved_classes(const nlohmann::json& meta, const std::string& path) const;
  // Checks the data's class names against the checkpoint's `saved` (see load_model).
  void match_classes(const std::vector<std::string>& saved, const std::string& path,
                     LabelUse labels);
  void restore_tensors(const checkpoint::State& ckpt, const std::string& path);
  void restore_position(const nlohmann::json& meta, const std::string& path);
  // How a save went, as rank 0 broadcasts it.
  enum SaveStatus : int64_t { kSaved, kFailedGoOn, kFailedStop };
  // One save, from the state's snapshot to its outcome (checkpointer_save.cpp).
  struct Save;
  // Rank 0 writes; every rank learns whether it could.
  void write(const EvalResult& eval);
  // run.checkpoint_async: the host copy, then the write on the background thread.
  void write_async(std::map<std::string, double> metrics);
  // The pieces of this rank's shard file: the parameters', the optimizer's and the saved parts'
  // (with tensor parallelism, of its parts: tensor_parallel_pieces).
  std::vector<checkpoint::ShardPiece> shard_pieces() const;
  // Writes this rank's shard file of `step`; its description, or "!rank N: <error>".
  std::string write_own_shard(int64_t step,
                              const std::vector<checkpoint::ShardPiece>& pieces) const;
  // Every rank's shard description (`mine` here) to rank 0, or `error` naming the ranks that
  // failed. Every rank must call this, in the same order.
  nlohmann::json gather_shards(const std::string& mine, std::string& error) const;
  // Rank 0: writes `save`'s state (with the `shards` described, or fails with `shard_error`) as
  // the checkpoint of its step and logs it; sets its path or its failure.
  void commit(Save& save, const nlohmann::json& shards, const std::string& shard_error);
  // Every rank learns rank 0's `status`; a failure throws or is logged.
  void agree(SaveStatus status, const std::string& msg, int64_t step);

  const config::LoadedConfig& loaded_;
  Components& parts_;
  TrainingState& state_;
  const distributed::DistEnv& job_;
  std::vector<SavedPart*> extras_;
  std::unique_ptr<checkpoint::Directory> dir_;
  std::string last_;
  int64_t resumed_step_ = -1;
  int64_t saved_step_ = -1;        // the step of the newest checkpoint written or resumed from
  std::shared_ptr<Save> pending_;  // the background write in flight
  AsyncWriter writer_;             // last: its thread ends before the members it uses
};

}  // namespace trainer::engine
