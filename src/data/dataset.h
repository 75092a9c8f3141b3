// Datasets and the batch loader.
//
// A dataset is random access: get(indices) returns the samples at those indices as one batch.
// Datasets are registered by their YAML `data.name`; the factory builds the train and validation
// splits from the data section of the config.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/config.h"
#include "util/registry.h"

namespace trainer::data {

// A batch on the host: inputs [B, ...sample_shape] float32, targets [B] int64.
struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

// Random-access samples. get() is called from several loader threads at once.
class Dataset {
 public:
  virtual ~Dataset() = default;
  // Number of samples.
  virtual int64_t size() const = 0;
  // The samples at `indices` (each in [0, size())), stacked in that order.
  virtual Batch get(const std::vector<int64_t>& indices) const = 0;
};

// `indices` as a [B] int64 tensor for index_select; throws std::out_of_range naming `dataset`
// when one is outside [0, size).
torch::Tensor index_tensor(const std::vector<int64_t>& indices, int64_t size,
                           const std::string& dataset);

// What a model needs to know about the data.
struct DataSpec {
  std::vector<int64_t> sample_shape;  // e.g. {1, 28, 28}
  int64_t num_classes = 0;
};

struct Splits {
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> val;
  DataSpec spec;
};

// Thrown for unreadable, truncated or corrupt data files; the message names the file and the
// problem.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds the splits from the data section; `seed` is the run's seed.
using DatasetFactory = std::function<Splits(const config::DataConfig& cfg, int64_t seed)>;
using DatasetRegistry = Registry<DatasetFactory>;

// The built-in datasets (synthetic, fashion_mnist).
const DatasetRegistry& dataset_registry();

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;      // a new permutation every epoch, from (seed, epoch) alone
  bool drop_last = true;    // drop the final incomplete batch
  int64_t workers = 0;      // background threads assembling batches; 0 = on the caller's thread
  int64_t prefetch = 2;     // batches each worker keeps ready
  uint64_t seed = 0;        // the run's seed
  bool pin_memory = false;  // page-lock batches for asynchronous copies to a GPU
};

// Hands out the batches of one epoch at a time, in an order that depends only on
// (seed, epoch), never on the number of workers or on timing.
class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Batches in one epoch.
  int64_t batches_per_epoch() const;
  // Samples in one epoch (batches_per_epoch() batches; the last may be short).
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
