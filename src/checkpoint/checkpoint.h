// Training checkpoints in <run.dir>/checkpoints/: one safetensors file per checkpoint
// (step_00001234.safetensors, the engine's tensors plus its JSON metadata) and manifest.json,
// which lists them with their step, size, xxHash64 checksum and validation metrics.
//
// A tensor given under several names that is one tensor (the same view of the same memory: a
// tied weight, as lm_head.weight is transformer.wte.weight) is stored once, as safetensors'
// save_model stores shared tensors; the file's metadata "trainer.aliases" names, for each name
// left out, the one it is stored under, and loading gives it under every name again.
//
// Every file is written atomically (util/fileio.h), the checkpoint before the manifest that names
// it, so a crash at any moment leaves a manifest whose checkpoints are all complete.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

#include <torch/types.h>

namespace trainer::checkpoint {

// What a checkpoint holds: named tensors and a JSON document (the engine decides both).
struct State {
  NamedTensors tensors;
  nlohmann::json meta;
};

// Elements [offset, offset + data.numel()) of the flattened tensor `name` of `shape`: one
// process's part of a tensor sharded over several.
struct ShardPiece {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  torch::Tensor data;
};

// A checkpoint that fails its checksum or cannot be parsed; the message names the file.
class CorruptCheckpoint : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One manifest entry.
struct Entry {
  std::string file;  // name within the directory
  int64_t step = 0;
  uint64_t bytes = 0;
  std::string xxh64;                      // hex checksum of the whole file
  std::map<std::string, double> metrics;  // the validation metrics at that step, if any
};

class Directory {
 public:
  // keep_last: checkpoints kept besides the best; keep_best: a validation metric (top1, top5:
  // higher is better; loss, ppl: lower is better) whose best checkpoint is kept too, or "".
  Directory(std::string dir, int64_t keep_last, std::string keep_best);

  const std::string& path() const { return dir_; }

  // Writes the checkpoint of `step` and the manifest, then removes checkpoints no longer kept
  // (unlisted checkpoint files too, by the same rule) and every shard folder of a step not kept
  // (a sharded save: the caller wrote the shards of `step` first) and the files of `step`'s shard
  // folder that its meta["shards"] does not list.
  // Throws IoError (util/fileio.h) when writing fails; the previous checkpoints stay intact.
  std::string save(int64_t step, const State& state, const std::map<std::string, double>& metrics);

  // The checkpoints, oldest first: the manifest's entries, plus every checkpoint file it does not
  // list (left by a process killed between writing the file and the manifest; every file when
  // the manifest cannot be read), entered with its checksum once it parses as a whole trainer
  // checkpoint. Reads each unlisted file once.
  std::vector<Entry> entries() const;

  // Enters the checkpoint files the manifest does not list (as entries() finds them) into it,
  // pruning as save() does: for the process that writes the run's checkpoints, when it resumes
  // (a run killed between a file and its manifest entry may resume at its last step and save no
  // more). Throws IoError when the manifest cannot be written.
  void enter_unlisted();

  // The newest checkpoint that loads and verifies, with its path. Corrupt ones are skipped with
  // a warning naming them; nullopt when there is none. Throws CorruptCheckpoint naming every
  // file when there are checkpoints and none verifies.
  std::optional<std::pair<std::string, State>> load_latest() const;

 private:
  std::optional<Entry> adopt(const std::string& name) const;
  void write_manifest(const std::vector<Entry>& entries) const;
  // Writes the manifest of `all` (oldest first) without the checkpoints pruning drops, then
  // removes their files and shard folders.
  std::vector<Entry> write_pruned(std::vector<Entry> all) const;
  void remove_stale_temporaries() const;
  // The files of `all` (oldest first) that pruning keeps: the newest keep_last, the best.
  std::set<std::string> kept_files(const std::vector<Entry>& all) const;
  // Removes the shard folders (step_N.shards) of every step `kept` does not list.
  void remove_unkept_shards(const std::vector<Entry>& kept) const;
  // Removes the files in step_<step>.shards that `meta`'s "shards" does not list (all of them,
  // and the folder, when it lists none).
  void remove_unlisted_shard_files(int64_t step, const nlohmann::json& meta) const;

  // Logs `message` as a warning unless this directory has logged it before: an unusable file or
  // manifest is found again at every listing (the resume, each save), and said once.
  void warn_once(const std::string& message) const;

  std::string dir_;
  int64_t keep_last_;
  std::string keep_best_;
  mutable std::mutex warned_mutex_;       // guards warned_ (a save may run on a writer thread)
  mutable std::set<std::string> warned_;  // the warnings warn_once has logged
};

// Sharded checkpoints (dist.strategy fsdp): every process writes its pieces of the sharded tensors
// to <dir>/step_<step>.shards/rank_<rank>_of_<world>.safetensors (atomically) and returns the
// file's description: its name, size, xxHash64 and the pieces' names, global shapes and offsets.
// Then one process saves the checkpoint (Directory::save) with the descriptions of every rank's
// file as meta["shards"]. Throws IoError when writing fails.
nlohmann::json write_shard(const std::string& dir, int64_t step, int rank, int world,
                           const std::vector<ShardPiece>& pieces);

// Loads `path`, verifying its checksum against the manifest of its directory when that lists it
// (else only its structure, with a warning). A sharded checkpoint's shard files are read and
// verified against its meta["shards"] and their pieces assembled into whole tensors, so that the
// State is the same for any number of processes that wrote it. Throws CorruptCheckpoint (a
// damaged, missing or incomplete shard names its file) or FormatError.
State load(const std::string& path);

// The step of a checkpoint's file name (step_00001234.safetensors -> 1234); -1 for any other
// name.
int64_t checkpoint_step(const std::string& file_name);

// The xxHash64 of `bytes` as 16 hex digits.
std::string xxh64_hex(const std::vector<uint8_t>& bytes);

}  // namespace trainer::checkpoint
