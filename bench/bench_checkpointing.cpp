// Activation checkpointing: step time and step memory of a model trained with and without it,
// the trainer's side of scripts/bench_checkpointing.sh (scripts/bench_checkpointing.py is
// PyTorch's side, with torch.utils.checkpoint).
//
//   bench_checkpointing --model resnet50|gpt --checkpointing none|blocks|every:N [--batch N]
//                       [--steps N] [--warmup N] [--threads N] [--block-size N] [--n-layer N]
//
// A step is zero_grad(set_to_none) outside the timing, then forward, the trainer's cross-entropy,
// backward and an SGD (momentum 0.9) update. Before each timed step the process's peak RSS is reset
// (/proc/self/clear_refs); the step's peak is VmHWM minus the RSS at its start. Prints one JSON
// line; "step_alloc_peak_mb" is the same peak counted by LibTorch's CPU allocator.
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "engine/measure/memory.h"
#include "losses/loss.h"
#include "models/model.h"

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "bench_checkpointing: " << why
            << "\nusage: bench_checkpointing --model resnet50|gpt --checkpointing "
               "none|blocks|every:N [--batch N] [--steps N] [--warmup N] [--threads N] "
               "[--block-size N] [--n-layer N]\n";
  std::exit(2);
}

int64_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name, checkpointing = "none";
  int64_t batch = 0, steps = 3, warmup = 1, threads = 2, block_size = 1024, n_layer = 12;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage("missing value after " + arg);
    const std::string value = argv[++i];
    auto number = [&] {
      try {
        return std::stoll(value);
      } catch (const std::exception&) {
        usage(arg + " needs a number, got '" + value + "'");
      }
    };
    if (arg == "--model") {
      model_name = value;
    } else if (arg == "--checkpointing") {
      checkpointing = value;
    } else if (arg == "--batch") {
      batch = number();
    } else if (arg == "--steps") {
      steps = number();
    } else if (arg == "--warmup") {
      warmup = number();
    } else if (arg == "--threads") {
      threads = number();
    } else if (arg == "--block-size") {
      block_size = number();
    } else if (arg == "--n-layer") {
      n_layer = number();
    } else {
      usage("unknown option " + arg);
    }
  }
  if (model_name != "resnet50" && model_name != "gpt") usage("--model must be resnet50 or gpt");
  if (steps < 1) usage("--steps must be >= 1");
  const bool gpt = model_name == "gpt";
  if (batch == 0) batch = gpt ? 8 : 32;
  torch::manual_seed(0);
  torch::set_num_threads(static_cast<int>(threads));

  trainer::config::ModelConfig cfg = trainer::models::default_model_config(model_name);
  cfg.checkpointing = checkpointing;
  cfg.options.set("n_layer", n_layer);
  cfg.options.set("block_size", block_size);
  cfg.options.set("dropout", 0.0);
  const trainer::models::InputSpec input = gpt ? trainer::models::InputSpec{{block_size}, 50257}
                                               : trainer::models::InputSpec{{3, 224, 224}, 1000};
  trainer::models::Net model;
  try {
    model = trainer::models::build_model(cfg, input);
  } catch (const std::exception& e) {
    usage(e.what());
  }
  model->train();
  const auto params = trainer::models::unique_parameters(*model);
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.01).momentum(0.9));
  const auto x = gpt ? torch::randint(/*high=*/50257, {batch, block_size})
                     : torch::randn({batch, 3, 224, 224});
  const auto y = gpt ? torch::randint(/*high=*/50257, {batch, block_size})
                     : torch::randint(/*high=*/1000, {batch});
  const trainer::config::TrainConfig train;  // the defaults: plain cross-entropy
  const auto loss_fn = trainer::losses::loss_registry().get("cross_entropy")(train);
  float last_loss = 0.0f;
  auto step = [&] {
    auto loss = loss_fn(model->forward(x), y);
    loss.backward();
    optimizer.step();
    last_loss = loss.item<float>();
  };
  for (int64_t i = 0; i < warmup; ++i) {
    optimizer.zero_grad(/*set_to_none=*/true);
    step();
  }
  std::vector<double> times;
  int64_t rss_before = 0, step_peak = 0, alloc_peak = 0;
  bool peak_reset = true;
  for (int64_t i = 0; i < steps; ++i) {
    optimizer.zero_grad(/*set_to_none=*/true);
    rss_before = rss_bytes();
    peak_reset = reset_peak_rss() && peak_reset;
    const auto start = std::chrono::steady_clock::now();
    const int64_t allocated = trainer::engine::measure_cpu_peak(step);
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    step_peak = std::max(step_peak, peak_rss_bytes() - rss_before);
    alloc_peak = std::max(alloc_peak, allocated);
  }
  auto sorted = times;
  std::sort(sorted.begin(), sorted.end());
  double params_bytes = 0;
  for (const auto& p : params) params_bytes += static_cast<double>(p.numel()) * 4;
  nlohmann::json out = {{"impl", "trainer"},
                        {"model", model_name},
                        {"checkpointing", checkpointing},
                        {"batch", batch},
                        {"threads", threads},
                        {"block_size", gpt ? nlohmann::json(block_size) : nlohmann::json()},
                        {"steps", steps},
                        {"step_s", times},
                        {"step_s_median", sorted[sorted.size() / 2]},
                        {"rss_before_mb", static_cast<double>(rss_before) / 1e6},
                        {"step_peak_mb", static_cast<double>(step_peak) / 1e6},
                        {"step_alloc_peak_mb", static_cast<double>(alloc_peak) / 1e6},
                        {"params_mb", params_bytes / 1e6},
                        {"loss", last_loss},
                        {"torch", TORCH_VERSION},
                        {"peak_reset", peak_reset}};
  std::cout << out.dump() << std::endl;
  return 0;
}
