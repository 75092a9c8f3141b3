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

// Moves `t` to the meta device in place (every handle of it, a module's member and its registered
// parameter alike, then holds the same shape, strides and dtype without storage; its memory is
// freed once nothing else holds it). A planned model's parameters (nn/deferred_init.h).
void move_to_meta(torch::Tensor& t);
// The same with other sizes (contiguous): a layer built as a stand-in takes its real shape.
void move_to_meta(torch::Tensor& t, c10::IntArrayRef sizes);

// move_to_meta for every parameter and buffer of `module` and its submodules not on the meta
// device already.
void move_to_meta(torch::nn::Module& module);

}  // namespace trainer::nn
