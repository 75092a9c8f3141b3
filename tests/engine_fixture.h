// What the engine's test suites share: a small synthetic-data run's config and its checkpoints.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/loader.h"
#include "engine/loop/trainer.h"
#include "temp_dir.h"

namespace trainer::engine {

class EngineTest : public ::testing::Test {
 protected:
  // A validated config for a small synthetic-data run, with `overrides` applied.
  config::LoadedConfig load(const std::vector<std::string>& overrides) {
    const auto path = tmp_ / ("run" + std::to_string(++runs_) + ".yaml");
    std::ofstream(path) << "seed: 5\ndeterministic: true\ndevice: cpu\n"
                           "model: {name: mlp, hidden: [16]}\n"
                           "data: {name: synthetic, shape: [12], num_classes: 3, "
                           "train_samples: 128, val_samples: 64, batch_size: 32, workers: 0}\n"
                           "train: {max_steps: 4}\noptim: {lr: 0.1, momentum: 0.0}\n"
                           "run: {log_every: 1, progress: never, dir: "
                        << (tmp_ / ("out" + std::to_string(runs_))).string() << "}\n";
    auto loaded = engine::load_config(path.string(), overrides);
    config::check(loaded, config::Environment{});
    std::filesystem::create_directories(loaded.cfg.run.dir);
    return loaded;
  }

  test_support::TempDir tmp_{"engine"};
  int runs_ = 0;
};

inline // The tensors of the last checkpoint a trainer wrote, by name.
std::map<std::string, torch::Tensor> checkpoint_tensors(const Trainer& t) {
  const auto state = checkpoint::load(t.last_checkpoint());
  return {state.tensors.begin(), state.tensors.end()};
}

// Expects the tensors whose names start with `prefix` to be equal bit for bit in `a` and `b`.
inline void expect_same(const std::map<std::string, torch::Tensor>& a,
                 const std::map<std::string, torch::Tensor>& b, const std::string& prefix) {
  int compared = 0;
  for (const auto& [name, tensor] : a) {
    if (name.rfind(prefix, 0) != 0) continue;
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name;
    ++compared;
  }
  EXPECT_GT(compared, 0) << prefix;
}

}  // namespace trainer::engine
