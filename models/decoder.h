// What gpt and llama share as decoder-only language models: token ids to hidden states (each
// model's own), then a bias-free output layer, lm_head, vocabulary-parallel under tensor
// parallelism; and the output weight the chunked loss takes (model.fused_kernels).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>

#include "models/builtin.h"
#include "models/model.h"
#include "nn/aligned_head.h"
#include "nn/tensor_parallel.h"

namespace trainer::models {

class DecoderImpl : public NetImpl {
 public:
  torch::Tensor forward(torch::Tensor x) override { return forward_packed(std::move(x), {}); }

  bool takes_positions() const override { return true; }

  torch::Tensor forward_packed(torch::Tensor x, const torch::Tensor& positions) override {
    return logits(hidden(std::move(x), positions));  // [B, T, vocab'] (vocab / tp under tp)
  }

  // lm_head's weight when model.fused_kernels asks for the output layer and the loss in one
  // (losses/output_loss.h): `on` on any device, `auto` on a GPU; never under tensor parallelism.
  torch::Tensor output_weight() const override {
    const auto& w = lm_head->weight;
    const bool fused = fused_kernels_ == "on" || (fused_kernels_ == "auto" && w.is_cuda());
    return !tp_ && fused ? w : torch::Tensor();
  }

  torch::Tensor forward_hidden(torch::Tensor x, const torch::Tensor& positions) override {
    TORCH_CHECK(!tp_, "the output layer is split over the tensor-parallel group");
    return hidden(std::move(x), positions);
  }

  nn::AlignedHead lm_head{nullptr};

 protected:
  // `fused_kernels`: model.fused_kernels.
  explicit DecoderImpl(std::string fused_kernels) : fused_kernels_(std::move(fused_kernels)) {}

  // Token ids x [B, T] (positions [B, T] of packed rows, or undefined) -> the hidden states before
  // the output layer, [B, T, C].
  virtual torch::Tensor hidden(torch::Tensor x, const torch::Tensor& positions) = 0;

  // The output layer of h [..., C]: [..., vocab'] (vocab / tp under tp).
  torch::Tensor logits(const torch::Tensor& h) {
    return lm_head->forward(tp_ ? tp_->copy_in(h) : h);
  }

  std::shared_ptr<nn::TensorParallel> tp_;  // the group the layers split over; null: whole

 private:
  std::string fused_kernels_;
};

}  // namespace trainer::models
