// Helper of tests/optim_check.py: runs the trainer's optimizers on given gradients.
//
//   optim_tool IN.safetensors OUT.safetensors NAME IMPL [KEY=VALUE]...
//
// IN holds the initial parameters "p.<i>" (2-D ones decayed, 1-D ones not, as the trainer splits
// a model's), their gradients "g.<step>.<i>" and the learning rate of each step "lr" ([steps],
// float64). KEY=VALUE sets optim keys (weight_decay, momentum, nesterov, betas=a,b, eps, amsgrad)
// and clip=X clips the gradients to global norm X before each step as the engine does (a fused
// implementation divides by the clipping factor in its kernel). Writes the parameters after
// the last step to OUT as "p.<i>". Exit 1 with a message on any problem.
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "checkpoint/safetensors.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "util/fileio.h"

namespace {

using namespace trainer;

// Sets one optim key from its text.
void set_key(config::OptimConfig& cfg, const std::string& key, const std::string& value) {
  if (key == "weight_decay") {
    cfg.weight_decay = std::stod(value);
  } else if (key == "nesterov" || key == "amsgrad") {
    cfg.options.set(key, value == "true");
  } else if (key == "betas") {
    std::vector<double> betas;
    std::stringstream in(value);
    for (std::string b; std::getline(in, b, ',');) betas.push_back(std::stod(b));
    cfg.options.set(key, betas);
  } else {
    cfg.options.set(key, std::stod(value));
  }
}

int run(int argc, char** argv) {
  const auto in = checkpoint::read_safetensors(argv[1]);
  std::map<std::string, torch::Tensor> t(in.tensors.begin(), in.tensors.end());
  config::OptimConfig cfg = optim::default_optim_config(argv[3]);
  cfg.impl = argv[4];
  double clip = 0.0;
  for (int i = 5; i < argc; ++i) {
    const std::string option = argv[i];
    const auto eq = option.find('=');
    if (option.substr(0, eq) == "clip") {
      clip = std::stod(option.substr(eq + 1));
    } else {
      set_key(cfg, option.substr(0, eq), option.substr(eq + 1));
    }
  }
  torch::nn::Module module;
  std::vector<torch::Tensor> params;
  for (int i = 0; t.count("p." + std::to_string(i)); ++i) {
    params.push_back(
        module.register_parameter("p" + std::to_string(i), t.at("p." + std::to_string(i)).clone()));
  }
  auto optimizer = optim::make_optimizer(module, cfg);
  const auto lrs = t.at("lr");
  for (int64_t step = 0; step < lrs.size(0); ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() =
          t.at("g." + std::to_string(step) + "." + std::to_string(i)).clone();
    }
    optim::KernelInputs inputs;
    if (clip > 0) optim::clip_for_step(*optimizer, params, clip, optim::grad_norm(params), inputs);
    optimizer->step(lrs[step].item<double>(), inputs);
  }
  checkpoint::NamedTensors out;
  for (size_t i = 0; i < params.size(); ++i) {
    out.emplace_back("p." + std::to_string(i), params[i].detach());
  }
  write_atomically(argv[2],
                   [&](const ByteSink& sink) { checkpoint::write_safetensors(out, {}, sink); });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: optim_tool IN OUT NAME IMPL [KEY=VALUE]...\n";
    return 2;
  }
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "optim_tool: " << e.what() << "\n";
    return 1;
  }
}
