// Training checkpoints: the whole state of a run saved in <run.dir>/checkpoints and restored from
// there, so that a resumed run continues exactly as if never interrupted.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/loader.h"
#include "distributed/env.h"
#include "engine/persist/async_writer.h"
#include "engine/setup/components.h"
#include "engine/setup/results.h"
#include "engine/setup/saved_part.h"
#include "engine/setup/state.h"

namespace trainer::engine {

// The checkpoints a run keeps besides the best: run.keep_last, and with train.rollback_on_nan at
// least train.max_rollbacks + 1, so that every checkpoint a rollback may go back to is kept.
int64_t kept_checkpoints(const config::Config& cfg);

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

  // train.rollback_on_nan: goes back, after a bad step, to the newest checkpoint of the run
  // directory that no rollback of this run went back to yet (one that led to a failure again is
  // passed over for the one before it), keeping the data's position. The model, optimizer,
  // scaler, RNGs and saved parts become the checkpoint's; the step count stays, the steps of
  // the model's history since the checkpoint counted as skipped (so the schedule's clock is the
  // checkpoint's again) and, each once, as rolled back and as lost (lost_steps()); the metrics
  // window starts afresh. Returns the checkpoint's step, or -1 (nothing changed) when every kept
  // checkpoint was gone back to already. Every rank must call this, in the same order (rank 0
  // picks the checkpoint).
  int64_t rollback();

  // The steps rollbacks undid since the last checkpoint written (train.max_bad_steps counts
  // them with the inf/NaN steps in a row); 0 after each save.
  int64_t lost_steps() const { return lost_steps_; }

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

  // Whether the last checkpoint whose model was loaded gave train.ema's average of the weights
  // (else the trained ones).
  bool used_average() const { return used_average_; }

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
  // Refuses a checkpoint whose model, optimizer or data set differ from the config's; with
  // `resuming`, logs the other keys that changed (a model only used has nothing to resume).
  void check_config(const nlohmann::json& saved, const std::string& path, bool resuming) const;
  // Warns when the learning rate of the next update differs from the one the checkpoint's run
  // would have used (`saved`: its meta["schedule"]), e.g. after train.max_steps changed.
  void warn_schedule_change(const nlohmann::json& saved) const;
  // `resuming`: training goes on from the checkpoint (else its model is only used: load_model()).
  void restore_model(const checkpoint::State& ckpt, const std::string& path, LabelUse labels,
                     bool resuming, WeightsUse weights = WeightsUse::trained);
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
  // Rank 0 writes; every rank learns whether it could. False, with a warning and nothing
  // written, when the state is not one to go back to (not_finite()).
  bool write(const EvalResult& eval);
  // What of the state to save is inf/NaN on some rank: "a parameter of the model", "the training
  // loss since the last log", or "" when nothing. Every rank must call this, in the same order;
  // reads the device.
  std::string not_finite() const;
  // train.rollback_on_nan: the path of the checkpoint rollback() goes back to ("" for none),
  // picked by rank 0 and known to every rank.
  std::string rollback_target();
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
  int64_t saved_step_ = -1;           // the step of the newest checkpoint written or resumed from
  std::set<int64_t> rolled_back_to_;  // the checkpoints (steps) rollbacks went back to
  int64_t lost_steps_ = 0;            // see lost_steps()
  bool used_average_ = false;         // see used_average()
  std::shared_ptr<Save> pending_;     // the background write in flight
  AsyncWriter writer_;                // last: its thread ends before the members it uses
};

// A checkpoint's model weights with its average's (ema.*) in place of the parameters: what
// eval, predict and export use by default. Empty when the checkpoint holds no average.
checkpoint::NamedTensors averaged_weights(const checkpoint::State& ckpt);

}  // namespace trainer::engine
