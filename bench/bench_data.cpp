// Loader throughput: times the training split's batches of a config's data section, as the
// trainer's loader produces them (data.workers threads, data.prefetch, data.batch_size).
//
//   bench_data --config FILE [--set key=value ...] [--batches N] [--warmup N]
//
// Prints one JSON object: {"images_per_sec": ..., "batches": N, "batch_size": B, "workers": W,
// "seconds": ...}. The first --warmup batches (default 5) are not timed.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "config/loader.h"
#include "data/dataset.h"
#include "engine/setup/components.h"

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "bench_data: " << why
            << "\nusage: bench_data --config FILE [--set key=value ...] [--batches N] "
               "[--warmup N]\n";
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  std::vector<std::string> overrides;
  int64_t batches = 50, warmup = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage("missing value after " + arg);
    const std::string value = argv[++i];
    if (arg == "--config") {
      path = value;
    } else if (arg == "--set") {
      overrides.push_back(value);
    } else if (arg == "--batches") {
      batches = std::atoll(value.c_str());
    } else if (arg == "--warmup") {
      warmup = std::atoll(value.c_str());
    } else {
      usage("unknown argument " + arg);
    }
  }
  if (path.empty()) usage("--config is required");
  if (batches < 1 || warmup < 0) usage("--batches must be >= 1 and --warmup >= 0");
  try {
    const auto loaded = trainer::engine::load_config(path, overrides);
    const auto& cfg = loaded.cfg;
    if (cfg.run.threads > 0) torch::set_num_threads(static_cast<int>(cfg.run.threads));
    const auto splits = trainer::data::dataset_registry().get(cfg.data.name)(
        cfg.data, trainer::engine::data_context(cfg));
    trainer::data::LoaderOptions options;
    options.batch_size = cfg.data.batch_size;
    options.workers = cfg.data.workers;
    options.prefetch = cfg.data.prefetch;
    options.seed = static_cast<uint64_t>(cfg.seed);
    trainer::data::Loader loader(splits.train, options);
    const int64_t per_epoch = loader.batches_per_epoch();
    int64_t epoch = 0, taken = 0, images = 0;
    loader.start_epoch(epoch);
    auto next = [&] {
      auto b = loader.next();
      if (!b) {
        loader.start_epoch(++epoch);
        b = loader.next();
      }
      return *b;
    };
    for (int64_t i = 0; i < warmup; ++i) next();
    const auto start = std::chrono::steady_clock::now();
    for (; taken < batches; ++taken) images += next().targets.size(0);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "{\"images_per_sec\": %.1f, \"batches\": %lld, \"batch_size\": %lld, \"workers\": %lld, "
        "\"seconds\": %.3f, \"batches_per_epoch\": %lld}\n",
        static_cast<double>(images) / seconds, static_cast<long long>(taken),
        static_cast<long long>(cfg.data.batch_size), static_cast<long long>(cfg.data.workers),
        seconds, static_cast<long long>(per_epoch));
  } catch (const std::exception& e) {
    std::cerr << "bench_data: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
