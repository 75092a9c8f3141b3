// Datasets and the batch loader.
//
// A dataset is random access: get(indices) returns the samples at those indices as one batch.
// Datasets are registered by their YAML `data.name`, each with its own keys (config/options.h);
// the factory builds the train and validation splits from the data section of the config.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "config/registry.h"
#include "text/error.h"

namespace trainer::data {

// A target the loss leaves out (a token that does not train, padding): PyTorch's ignore_index,
// as losses::kIgnoreIndex.
constexpr int64_t kIgnoreTarget = -100;

// A batch on the host: inputs [B, ...sample_shape] (float32 images or int64 tokens), targets
// [B] int64 class indices or [B, T] int64 next tokens (kIgnoreTarget where none trains).
struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
  int64_t bad_samples = 0;            // unreadable samples replaced by others in this batch
  std::vector<int64_t> indices = {};  // the data set's samples the loader asked for, in order
  // Packed token sequences (data.pack: several documents in a row): [B, T] int64, each token's
  // position within its document, 0 at a document's first token (padding after the documents is
  // one more document). Undefined when each row is one document at positions 0..T-1. A model
  // given positions must (1) rotate queries and keys by these positions (RoPE) instead of
  // 0..T-1, and (2) keep attention inside each document: with doc(t) the number of zeros in
  // positions[b, 0..t], token t attends to token u only if u <= t and doc(u) == doc(t) (a
  // block-diagonal causal mask, e.g. a [B, 1, T, T] boolean SDPA attn_mask, or FlashAttention's
  // varlen form with cu_seqlens at the zeros). Then a packed row computes what its documents
  // compute each in a row of its own.
  torch::Tensor positions = {};
};

// Which epoch a batch belongs to: per-sample randomness (augmentation, window offsets) is drawn
// from a generator seeded by (seed, epoch, index) alone, so it depends on neither the thread that
// assembles the batch nor the number of workers.
struct Epoch {
  uint64_t seed = 0;  // the run's seed
  int64_t index = 0;  // 0-based epoch number
  // The seed of sample `sample` in this epoch.
  uint64_t sample_seed(int64_t sample) const;
};

// Random-access samples. get() is called from several loader threads at once.
class Dataset {
 public:
  virtual ~Dataset() = default;
  // Number of samples.
  virtual int64_t size() const = 0;
  // The samples at `indices` (each in [0, size())), stacked in that order, as drawn in `epoch`.
  Batch get(const std::vector<int64_t>& indices, const Epoch& epoch = Epoch{}) const {
    return fetch(indices, epoch);
  }
  // The model input [C, H, W] (float32) for an image file's `bytes`, transformed as this split's
  // samples are. Throws DataError naming `path` for an unreadable image, or when the data set's
  // samples are not images.
  virtual torch::Tensor input_from_image(const std::vector<uint8_t>& bytes,
                                         const std::string& path) const;
  // The order of every sample in epoch `epoch`, the same on any number of ranks (each rank takes
  // every world_size-th entry of it): by default 0..size()-1, or a permutation drawn from
  // (seed, epoch) alone when `shuffle`. A data set read in streams (webdataset's shards) or drawn
  // from others (data.mix) orders its samples itself.
  virtual std::vector<int64_t> order(bool shuffle, uint64_t seed, int64_t epoch) const;
  // A name of sample `index` for messages and tools: where it comes from (a file, a shard and
  // key) where the data set knows, else the index.
  virtual std::string sample_name(int64_t index) const { return std::to_string(index); }

 protected:
  virtual Batch fetch(const std::vector<int64_t>& indices, const Epoch& epoch) const = 0;
};

// `dataset` with each class label t of its targets [B] replaced by to_model[t].
std::shared_ptr<const Dataset> with_labels(std::shared_ptr<const Dataset> dataset,
                                           std::vector<int64_t> to_model);

// Throws std::out_of_range naming `dataset` when an index is outside [0, size).
void check_indices(const std::vector<int64_t>& indices, int64_t size, const std::string& dataset);

// `indices` as a [B] int64 tensor for index_select, after check_indices.
torch::Tensor index_tensor(const std::vector<int64_t>& indices, int64_t size,
                           const std::string& dataset);

// What a model needs to know about the data.
struct DataSpec {
  std::vector<int64_t> sample_shape;  // e.g. {1, 28, 28}, or {T} for token sequences
  int64_t num_classes = 0;            // classes, or the vocabulary size of token sequences
  bool sequence = false;              // targets are [B, T] next tokens (language modelling)
  bool packed = false;                // rows hold several documents: batches carry Batch::positions
  bool vocabulary_known = false;      // sequences: num_classes is the vocabulary itself (bytes, a
                                      // tokenizer's), not only the largest token id seen + 1
  std::vector<std::string> class_names;  // by label, where the data set names its classes
};

struct Splits {
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> val;
  DataSpec spec;
};

// What a data set is built for, beyond its config section.
struct DataContext {
  int64_t seed = 0;             // the run's seed
  int64_t context_length = 0;   // tokens per sample the model reads (0: not a language model), the
                                // length token data cuts samples to when data.seq_len is 0
  std::string pretrained = {};  // model.pretrained: a Hugging Face model folder, or a safetensors
                                // file in one, whose tokenizer chat data reads; "" for none
};

// Builds the splits from the data section (each data set reads its own keys with cfg.own<T>()).
using DatasetFactory = std::function<Splits(const config::DataConfig& cfg, const DataContext& ctx)>;
using DatasetRegistry = Registry<DatasetFactory>;

// The built-in datasets (synthetic, synthetic_tokens, fashion_mnist, cifar10, imagefolder, tokens,
// webdataset, mix, chat).
const DatasetRegistry& dataset_registry();

// The data section with every data set's default options and name `name`.
config::DataConfig default_data_config(const std::string& name = "synthetic");

// Adds data.val_fraction's problem to `c` (a data set's own checks) unless it is in (0, 1).
void check_val_fraction(config::Checks& c, double fraction);

// The samples' token count: data.seq_len when it is set, else the model's context length. Throws
// DataConfigError when neither is.
int64_t sequence_length(int64_t seq_len, const DataContext& ctx);

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;      // a new permutation every epoch, from (seed, epoch) alone
  bool drop_last = true;    // drop the final incomplete batch
  int64_t workers = 0;      // background threads assembling batches; 0 = on the caller's thread
  int64_t prefetch = 2;     // batches each worker keeps ready
  uint64_t seed = 0;        // the run's seed
  bool pin_memory = false;  // page-lock batches for asynchronous copies to a GPU
  int64_t rank = 0;         // this process's shard of every epoch
  int64_t world_size = 1;   // number of shards
  int64_t throttle_ms = 0;  // extra time each batch takes to assemble (a slow input, simulated)
  // Every rank the same number of samples (with padding repeats unless drop_last), as DDP's
  // collectives need; false: each sample on one rank only, once (evaluation).
  bool even = true;
};

// The sample indices rank `rank` of `world_size` sees in epoch `epoch`: the epoch's order (a
// permutation from (seed, epoch) when shuffling, else 0..n-1), cut to a multiple of world_size
// when drop_last, else padded with its own first indices, then every world_size-th entry from
// `rank`. Across ranks, every sample appears exactly once per epoch (once or twice when padded).
std::vector<int64_t> shard_order(int64_t n, bool shuffle, bool drop_last, uint64_t seed,
                                 int64_t epoch, int64_t rank, int64_t world_size);
// The same for an epoch's `order` of every sample, as Dataset::order gives it.
std::vector<int64_t> shard_order(std::vector<int64_t> order, bool drop_last, int64_t rank,
                                 int64_t world_size);

// Hands out the batches of one epoch at a time, in an order that depends only on
// (seed, epoch, rank, world_size), never on the number of workers or on timing.
class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Batches in one epoch of this rank.
  int64_t batches_per_epoch() const;
  // Samples in one epoch of this rank (batches_per_epoch() batches; the last may be short).
  int64_t samples_per_epoch() const;

  // Starts epoch `epoch` (0-based) at batch `first_batch`, abandoning any epoch in progress.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);

  // The next batch of the current epoch, or nullopt when the epoch is over.
  std::optional<Batch> next();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainer::data
