// A module's parameters with tied weights counted once.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trainer::nn {

// The parameters of `module`, each tensor once under its first name (a tied weight, such as gpt's
// lm_head.weight and transformer.wte.weight, is registered under several names).
std::vector<std::pair<std::string, torch::Tensor>> unique_named_parameters(
    const torch::nn::Module& module);
std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module);

// Total number of parameter elements, tied weights counted once.
int64_t parameter_count(const torch::nn::Module& module);

}  // namespace trainer::nn
