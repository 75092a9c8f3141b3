// A language model's bias-free output layer on aligned_linear (nn/aligned_linear.h).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <ostream>
#include <utility>

#include "nn/aligned_linear.h"

namespace trainer::nn {

// The output layer x [..., C] -> [..., vocab]: its weight [vocab, C] is the token embedding's
// (tied: owned by another module) or its own; the output's rows 64-element aligned.
class AlignedHeadImpl : public torch::nn::Module {
 public:
  AlignedHeadImpl(torch::Tensor weight, bool tied) : tied_(tied) {
    this->weight = register_parameter("weight", std::move(weight));
  }

  torch::Tensor forward(const torch::Tensor& x) { return aligned_linear(x, weight); }

  void pretty_print(std::ostream& stream) const override {
    stream << "Linear(in_features=" << weight.size(1) << ", out_features=" << weight.size(0)
           << ", bias=false" << (tied_ ? ", tied" : "") << ")";
  }

  torch::Tensor weight;

 private:
  bool tied_;
};
TORCH_MODULE(AlignedHead);

}  // namespace trainer::nn
