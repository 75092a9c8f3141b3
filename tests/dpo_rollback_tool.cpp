// Helper of dpo_rollback_check.py: trains CONFIG in RUN_DIR as `trainer --config CONFIG --run-dir
// RUN_DIR` does, with NaN gradients in the backward passes numbered CALLS ("4" or "4,9", 1-based)
// of the first trained parameter: such a step's update makes the weights NaN and the next step's
// loss is NaN, which train.rollback_on_nan goes back from.
#include <torch/torch.h>

#include <cmath>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "config/loader.h"
#include "engine/loop/trainer.h"
#include "engine/setup/components.h"

namespace {

std::set<int> parse_calls(const std::string& text) {
  std::set<int> calls;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) calls.insert(std::stoi(item));
  return calls;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: dpo_rollback_tool CONFIG RUN_DIR CALLS\n";
    return 2;
  }
  try {
    const std::set<int> calls = parse_calls(argv[3]);
    auto loaded = trainer::engine::load_config(argv[1], {"run.dir=" + std::string(argv[2])});
    trainer::config::check(loaded, trainer::config::Environment{});
    std::filesystem::create_directories(loaded.cfg.run.dir);
    trainer::engine::Trainer t(loaded);
    auto count = std::make_shared<int>(0);
    for (auto& p : t.model().parameters()) {
      if (!p.requires_grad()) continue;
      p.register_hook([count, calls](torch::Tensor grad) {
        return calls.count(++*count) ? torch::full_like(grad, NAN) : grad;
      });
      break;
    }
    t.fit();
  } catch (const std::exception& e) {
    std::cerr << "dpo_rollback_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
