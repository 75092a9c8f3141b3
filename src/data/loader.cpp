// The batch loader: a per-epoch permutation from (seed, epoch), cut into batches that are
// assembled on the caller's thread or by worker threads into a bounded, in-order window.
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <variant>

#include "data/dataset.h"
#include "util/hash.h"

namespace trainer::data {
namespace {

// The sample order of one epoch: identity, or a Fisher-Yates shuffle driven by a generator
// seeded from (seed, epoch) alone.
std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  if (!shuffle) return order;
  std::mt19937_64 rng(mix_seed(seed, static_cast<uint64_t>(epoch) + 1));
  for (int64_t i = n - 1; i > 0; --i) {
    // Modulo bias is below n / 2^64: negligible, and the result is the same on every platform.
    const auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

// The number of samples each rank sees per epoch.
int64_t shard_size(int64_t n, bool drop_last, int64_t world_size) {
  return drop_last ? n / world_size : (n + world_size - 1) / world_size;
}

// Stream identifier of per-sample seeds.
constexpr uint64_t kSampleStream = 0x73616d706c65ULL;

}  // namespace

uint64_t Epoch::sample_seed(int64_t sample) const {
  return mix_seed(mix_seed(mix_seed(seed, kSampleStream), static_cast<uint64_t>(index)),
                  static_cast<uint64_t>(sample));
}

std::vector<int64_t> shard_order(int64_t n, bool shuffle, bool drop_last, uint64_t seed,
                                 int64_t epoch, int64_t rank, int64_t world_size) {
  return shard_order(epoch_order(n, shuffle, seed, epoch), drop_last, rank, world_size);
}

std::vector<int64_t> shard_order(std::vector<int64_t> order, bool drop_last, int64_t rank,
                                 int64_t world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("shard_order: rank " + std::to_string(rank) +
                                " is not in [0, world_size " + std::to_string(world_size) + ")");
  }
  const auto n = static_cast<int64_t>(order.size());
  const int64_t per_rank = shard_size(n, drop_last, world_size);
  const int64_t total = per_rank * world_size;
  // Padding repeats the order from its start (more than once when n < world_size).
  for (int64_t i = n; i < total; ++i) order.push_back(order[static_cast<size_t>(i % n)]);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank));
  for (int64_t i = rank; i < total; i += world_size) mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

std::vector<int64_t> Dataset::order(bool shuffle, uint64_t seed, int64_t epoch) const {
  return epoch_order(size(), shuffle, seed, epoch);
}

torch::Tensor Dataset::input_from_image(const std::vector<uint8_t>& /*bytes*/,
                                        const std::string& path) const {
  throw DataError(path + ": this data set's samples are not images");
}

void check_indices(const std::vector<int64_t>& indices, int64_t size, const std::string& dataset) {
  for (int64_t i : indices) {
    if (i < 0 || i >= size) {
      throw std::out_of_range(dataset + ": index " + std::to_string(i) + " out of range [0, " +
                              std::to_string(size) + ")");
    }
  }
}

namespace {

// A data set whose class labels are mapped onto another order (data.remap_classes).
class Relabelled final : public Dataset {
 public:
  Relabelled(std::shared_ptr<const Dataset> inner, std::vector<int64_t> to_model)
      : inner_(std::move(inner)), to_model_(torch::tensor(to_model, torch::kInt64)) {}

  int64_t size() const override { return inner_->size(); }
  torch::Tensor input_from_image(const std::vector<uint8_t>& bytes,
                                 const std::string& path) const override {
    return inner_->input_from_image(bytes, path);
  }
  std::vector<int64_t> order(bool shuffle, uint64_t seed, int64_t epoch) const override {
    return inner_->order(shuffle, seed, epoch);
  }
  std::string sample_name(int64_t index) const override { return inner_->sample_name(index); }

 protected:
  Batch fetch(const std::vector<int64_t>& indices, const Epoch& epoch) const override {
    Batch b = inner_->get(indices, epoch);
    b.targets = to_model_.index_select(/*dim=*/0, b.targets.reshape({-1})).view_as(b.targets);
    return b;
  }

 private:
  std::shared_ptr<const Dataset> inner_;
  torch::Tensor to_model_;  // [K] int64: the model's label of each data label
};

}  // namespace

std::shared_ptr<const Dataset> with_labels(std::shared_ptr<const Dataset> dataset,
                                           std::vector<int64_t> to_model) {
  return std::make_shared<Relabelled>(std::move(dataset), std::move(to_model));
}

torch::Tensor index_tensor(const std::vector<int64_t>& indices, int64_t size,
                           const std::string& dataset) {
  check_indices(indices, size, dataset);
  return torch::tensor(indices, torch::kInt64);
}

struct Loader::State {
  std::shared_ptr<const Dataset> dataset;
  LoaderOptions options;
  bool pin = false;  // options.pin_memory and a GPU is present
  int64_t size = 0;  // samples of this rank per epoch
  int64_t num_batches = 0;

  // The current epoch; written only by the caller's thread while no worker runs.
  bool started = false;
  std::vector<int64_t> order;  // sample indices of the epoch on this rank
  Epoch epoch;                 // seeds the samples' randomness
  int64_t next = 0;            // the next batch next() hands out
  int64_t end = 0;             // one past the last batch

  // Workers.
  using Result = std::variant<Batch, std::exception_ptr>;
  std::mutex mu;
  std::condition_variable cv;  // batches ready, window moved, or stop
  bool stop = false;
  std::map<int64_t, Result> ready;   // finished batches not yet handed out, by batch number
  std::vector<std::thread> threads;  // the workers of the current epoch

  Batch assemble(int64_t k) const {
    const int64_t begin = k * options.batch_size;
    const int64_t stop_at = std::min(begin + options.batch_size, size);
    std::vector<int64_t> indices(order.begin() + begin, order.begin() + stop_at);
    Batch b = dataset->get(indices, epoch);
    b.indices = std::move(indices);
    if (options.throttle_ms > 0) {  // a slow input, simulated (data.throttle_ms)
      std::this_thread::sleep_for(std::chrono::milliseconds(options.throttle_ms));
    }
    if (pin) {
      b.inputs = b.inputs.pin_memory();
      b.targets = b.targets.pin_memory();
      if (b.positions.defined()) b.positions = b.positions.pin_memory();
    }
    return b;
  }

  // Worker w assembles batches first + w, first + w + W, ...; it starts batch k only once k is
  // within W * prefetch batches of the next one to hand out, which bounds the batches held.
  void work(int64_t w, int64_t workers, int64_t first) {
    // One intra-op thread here, as PyTorch's DataLoader workers have: a worker's tensor work
    // (gathers, normalisation) would otherwise start its own team of OpenMP threads beside the
    // training thread's, which then share the cores with it (a third slower ResNet-18 steps on 2
    // cores). The setting is this thread's; threads already running keep theirs.
    at::set_num_threads(1);
    const int64_t window = workers * options.prefetch;
    for (int64_t k = first + w; k < end; k += workers) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || k < next + window; });
        if (stop) return;
      }
      Result result;
      try {
        result = assemble(k);
      } catch (...) {
        result = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stop) return;
        ready.emplace(k, std::move(result));
      }
      cv.notify_all();
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
    threads.clear();
    ready.clear();
    stop = false;
  }
};

Loader::Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : state_(std::make_unique<State>()) {
  if (!dataset) throw std::invalid_argument("Loader: null dataset");
  if (options.batch_size <= 0) {
    throw std::invalid_argument("Loader: batch_size must be positive, got " +
                                std::to_string(options.batch_size));
  }
  if (options.workers < 0) {
    throw std::invalid_argument("Loader: workers must not be negative, got " +
                                std::to_string(options.workers));
  }
  options.prefetch = std::max<int64_t>(options.prefetch, 1);
  state_->dataset = std::move(dataset);
  state_->options = options;
  state_->pin = options.pin_memory && torch::cuda::is_available();
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw std::invalid_argument("Loader: rank " + std::to_string(options.rank) +
                                " is not in [0, world_size " + std::to_string(options.world_size) +
                                ")");
  }
  const int64_t n = state_->dataset->size();
  state_->size = options.even ? shard_size(n, options.drop_last, options.world_size)
                 : n > options.rank
                     ? (n - options.rank + options.world_size - 1) / options.world_size
                     : 0;
  const int64_t b = options.batch_size;
  state_->num_batches = options.drop_last ? state_->size / b : (state_->size + b - 1) / b;
}

Loader::~Loader() {
  if (state_) state_->stop_workers();
}

int64_t Loader::batches_per_epoch() const {
  return state_->num_batches;
}

int64_t Loader::samples_per_epoch() const {
  return state_->options.drop_last ? state_->num_batches * state_->options.batch_size
                                   : state_->size;
}

void Loader::start_epoch(int64_t epoch, int64_t first_batch) {
  State& s = *state_;
  if (epoch < 0) throw std::invalid_argument("Loader: negative epoch " + std::to_string(epoch));
  if (first_batch < 0 || first_batch > s.num_batches) {
    throw std::out_of_range("Loader: first_batch " + std::to_string(first_batch) + " not in [0, " +
                            std::to_string(s.num_batches) + "]");
  }
  s.stop_workers();
  const auto& o = s.options;
  auto all = s.dataset->order(o.shuffle, o.seed, epoch);
  if (static_cast<int64_t>(all.size()) != s.dataset->size()) {
    throw std::logic_error("Loader: the data set ordered " + std::to_string(all.size()) +
                           " samples of " + std::to_string(s.dataset->size()));
  }
  if (o.even) {
    s.order = shard_order(std::move(all), o.drop_last, o.rank, o.world_size);
  } else {  // samples rank, rank + W, ... of the epoch's order, each once
    s.order.clear();
    for (size_t i = static_cast<size_t>(o.rank); i < all.size();
         i += static_cast<size_t>(o.world_size)) {
      s.order.push_back(all[i]);
    }
  }
  s.epoch = Epoch{o.seed, epoch};
  s.next = first_batch;
  s.end = s.num_batches;
  s.started = true;
  const int64_t workers = std::min(s.options.workers, s.end - first_batch);
  for (int64_t w = 0; w < workers; ++w) {
    s.threads.emplace_back([&s, w, workers, first_batch] { s.work(w, workers, first_batch); });
  }
}

std::optional<Batch> Loader::next() {
  State& s = *state_;
  if (!s.started) throw std::logic_error("Loader::next called before start_epoch");
  if (s.next >= s.end) return std::nullopt;
  if (s.threads.empty()) return s.assemble(s.next++);
  State::Result result;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return s.ready.count(s.next) != 0; });
    auto it = s.ready.find(s.next);
    result = std::move(it->second);
    s.ready.erase(it);
    ++s.next;
  }
  s.cv.notify_all();
  if (auto* error = std::get_if<std::exception_ptr>(&result)) std::rethrow_exception(*error);
  return std::get<Batch>(std::move(result));
}

}  // namespace trainer::data
