// Helper of tests/interop_check.py: the logits of a built-in model with given weights.
//
//   interop_tool MODEL NUM_CLASSES WEIGHTS.safetensors INPUT.safetensors OUT.safetensors [KEY=N]...
//
// Builds MODEL (e.g. resnet18) for NUM_CLASSES with its options KEY set (e.g. depth=2, the
// model.depth key; bias=false; rope_theta=1e6; rope_scaling=llama3: an integer, a boolean, a
// number or a string by the value's form), loads WEIGHTS strictly by name (a layout of Hugging
// Face's converted first, as model.pretrained does; WEIGHTS may be a Hugging Face folder, its
// model.safetensors or the shards its model.safetensors.index.json lists), runs the tensor "x" of
// INPUT through it in eval mode and writes {"logits": ...} to OUT. Exit 1 with a message on any
// problem.
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "checkpoint/hf_folder.h"
#include "checkpoint/safetensors.h"
#include "config/config.h"
#include "models/model.h"
#include "util/fileio.h"

namespace {

// The tensors of `path`: one safetensors file, or a Hugging Face folder's (all its shards).
trainer::checkpoint::NamedTensors read_weights(const std::string& path) {
  using namespace trainer::checkpoint;
  if (!is_directory(path)) return read_safetensors(path).tensors;
  const HfWeights weights = open_hf_weights(path);
  NamedTensors tensors;
  for (const auto& [name, where] : weights.tensors)
    tensors.emplace_back(name, weights.files[where.file].read(*where.entry));
  return tensors;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::cerr << "usage: interop_tool MODEL NUM_CLASSES WEIGHTS INPUT OUT [KEY=N]...\n";
    return 2;
  }
  try {
    using namespace trainer;
    config::ModelConfig cfg = models::default_model_config(argv[1]);
    cfg.num_classes = std::atoll(argv[2]);
    for (int i = 6; i < argc; ++i) {
      const std::string option = argv[i];
      const auto eq = option.find('=');
      const std::string value = option.substr(eq + 1);
      const std::string key = option.substr(0, eq);
      char* int_end = nullptr;
      char* real_end = nullptr;
      const long long integer = std::strtoll(value.c_str(), &int_end, 10);
      const double real = std::strtod(value.c_str(), &real_end);
      if (value == "true" || value == "false") {
        cfg.options.set(key, value == "true");
      } else if (!value.empty() && *int_end == '\0') {
        cfg.options.set(key, int64_t{integer});
      } else if (!value.empty() && *real_end == '\0') {
        cfg.options.set(key, real);
      } else {
        cfg.options.set(key, value);
      }
    }
    const auto input = checkpoint::read_safetensors(argv[4]);
    torch::Tensor x;
    for (const auto& [name, t] : input.tensors)
      if (name == "x") x = t;
    if (!x.defined()) throw std::runtime_error(std::string(argv[4]) + ": no tensor 'x'");
    std::vector<int64_t> shape(x.sizes().begin() + 1, x.sizes().end());
    auto model = models::build_model(cfg, models::InputSpec{shape, cfg.num_classes});
    const std::string problems = models::load_weights(
        *model, models::to_trainer_layout(argv[1], read_weights(argv[3])), false);
    if (!problems.empty()) throw std::runtime_error(problems);
    model->eval();
    torch::NoGradGuard no_grad;
    const auto logits = model->forward(x);
    write_atomically(argv[5], [&](const ByteSink& sink) {
      checkpoint::write_safetensors({{"logits", logits}}, {}, sink);
    });
  } catch (const std::exception& e) {
    std::cerr << "interop_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
