// What gpt and llama share as decoder-only language models: the token-input checks, token ids to
// hidden states through the token embedding (vocabulary-parallel under tensor parallelism), the
// positions' part (each model's own), the blocks and the final norm; cached decoding; and a
// bias-free output layer, lm_head, tied to the embedding or not, vocabulary-parallel under tensor
// parallelism, whose weight the chunked loss takes (model.fused_kernels). A decoder model's file
// holds its layers, its split plan and its initialisation.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/builtin.h"
#include "models/model.h"
#include "nn/aligned_head.h"
#include "nn/tensor_parallel.h"

namespace trainer::models {

// One block's cached keys and values.
using KeyValueCache = std::pair<torch::Tensor, torch::Tensor>;

// The vocabulary of decoder `model` (gpt, llama): model.vocab_size, or the data's class count when
// that is 0. Throws ModelError (model.vocab_size) when neither is > 0.
int64_t decoder_vocabulary(const std::string& model, int64_t vocab_size, const InputSpec& input);

// Throws ModelError when token data are longer than the context `block_size` (data.seq_len) or
// hold ids beyond a set `vocab_size` (model.vocab_size).
void check_token_input(int64_t block_size, int64_t vocab_size, const InputSpec& input);

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

  // Decoding (eval mode): the logits [B, vocab'] of the last of the new tokens x [B, T], which
  // stand at positions start.. after those the per-block `caches` hold (extended here).
  virtual torch::Tensor forward_cached(const torch::Tensor& x, int64_t start,
                                       std::vector<KeyValueCache>& caches) = 0;

  int64_t block_size() const { return block_size_; }
  virtual int64_t vocabulary() const = 0;

  nn::AlignedHead lm_head{nullptr};

 protected:
  // `name`: the model's, in messages; `fused_kernels`: model.fused_kernels; `block_size`: the
  // context length in tokens.
  DecoderImpl(std::string name, std::string fused_kernels, int64_t block_size)
      : name_(std::move(name)), fused_kernels_(std::move(fused_kernels)), block_size_(block_size) {}

  // Token ids x [B, T] (positions [B, T] of packed rows, or undefined) -> the hidden states before
  // the output layer, [B, T, C].
  virtual torch::Tensor hidden(torch::Tensor x, const torch::Tensor& positions) = 0;

  // Token ids x [B, T] no longer than the context, and packed positions [B, T] of the same shape
  // when defined: TORCH_CHECK, naming the model, otherwise.
  void check_tokens(const torch::Tensor& x, const torch::Tensor& positions) const {
    TORCH_CHECK(x.dim() == 2, name_, " expects token ids [B, T]; got ", x.dim(), " dims");
    TORCH_CHECK(x.size(1) <= block_size_, name_, ": sequence length ", x.size(1),
                " exceeds block_size ", block_size_);
    TORCH_CHECK(!positions.defined() || positions.sizes() == x.sizes(), name_, ": positions ",
                positions.sizes(), " do not match the token ids ", x.sizes());
  }

  // lm_head registered: the token embedding's weight `embedding` [vocab, C] when `tied`, else a
  // weight of its own of that shape, unwritten (the model's initialisation or a file fills it),
  // made with `untied`.
  void add_head(bool tied, const torch::Tensor& embedding, const torch::TensorOptions& untied) {
    lm_head = register_module(
        "lm_head", tied ? nn::AlignedHead(embedding, /*tied=*/true)
                        : nn::AlignedHead(torch::empty(embedding.sizes(), untied), false));
  }

  // The output layer of h [..., C]: [..., vocab'] (vocab / tp under tp).
  torch::Tensor logits(const torch::Tensor& h) {
    return lm_head->forward(tp_ ? tp_->copy_in(h) : h);
  }

  std::shared_ptr<nn::TensorParallel> tp_;  // the group the layers split over; null: whole

 private:
  std::string name_;
  std::string fused_kernels_;
  int64_t block_size_;
};

// A decoder whose layers are a token embedding, blocks of type `Block` and a final norm of type
// `Norm` (each model's own modules under its own names, given by set_stack()). `Position` is what
// the blocks take of the tokens' positions (llama: the rotation), made once per forward by the
// model's place(); `Block` has forward(h, position, mask) and forward_cached(h, position, cache),
// h [B, T, C] -> [B, T, C].
template <class Block, class Norm, class Position>
class DecoderModelImpl : public DecoderImpl {
 public:
  // Packed rows (positions [B, T] defined): attention block-causal (models/builtin.h), the mask
  // and the position made once for every block.
  torch::Tensor hidden(torch::Tensor x, const torch::Tensor& positions) override {
    // x: [B, T] token ids
    check_tokens(x, positions);
    auto h = embed(x);                                                      // [B, T, C]
    const Position position = place(h, positions, /*start=*/0, x.size(1));  // h: [B, T, C]
    const torch::Tensor mask = positions.defined() ? block_causal_mask(positions) : torch::Tensor();
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const auto block = blocks_[i].ptr();
      // The checkpointed rerun uses the position and mask captured here (no gradient flows into
      // them).
      h = runner_.run(
          static_cast<int64_t>(i), *block,
          [block, position, mask](const torch::Tensor& in) {
            return block->forward(in, position, mask);
          },
          h);  // [B, T, C]
    }
    return norm_->forward(h);  // [B, T, C]
  }

  torch::Tensor forward_cached(const torch::Tensor& x, int64_t start,
                               std::vector<KeyValueCache>& caches) override {
    const int64_t T = x.size(1);
    caches.resize(blocks_.size());
    auto h = embed(x);                                               // [B, T, C]
    const Position position = place(h, /*positions=*/{}, start, T);  // h: [B, T, C]
    for (size_t i = 0; i < blocks_.size(); ++i) {
      h = blocks_[i]->forward_cached(h, position, caches[i]);  // [B, T, C]
    }
    h = norm_->forward(h.select(/*dim=*/1, /*index=*/T - 1));  // [B, C]
    return logits(h);                                          // [B, vocab']
  }

  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const override {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (const auto& block : blocks_) out.push_back(block.ptr());
    return out;
  }

  int64_t vocabulary() const override { return embedding_->weight.size(0); }

 protected:
  using DecoderImpl::DecoderImpl;

  // The layers, registered by the model under its names: the token embedding, the blocks in
  // order, the final norm.
  void set_stack(torch::nn::Embedding embedding, std::vector<Block> blocks, Norm norm) {
    embedding_ = std::move(embedding);
    blocks_ = std::move(blocks);
    norm_ = std::move(norm);
  }

  // The positions' part of the token embeddings h [B, T, C]: of packed `positions` [B, T] when
  // defined, else of positions start.. start + T. What the blocks take; h may be changed (gpt adds
  // its position embeddings).
  virtual Position place(torch::Tensor& h, const torch::Tensor& positions, int64_t start,
                         int64_t T) = 0;

  // The token embeddings [B, T, C] of ids [B, T] (vocabulary-parallel under tp).
  torch::Tensor embed(const torch::Tensor& x) {
    return tp_ ? tp_->embedding(x, embedding_->weight) : embedding_->forward(x);
  }

  const std::vector<Block>& stack_blocks() const { return blocks_; }

 private:
  torch::nn::Embedding embedding_{nullptr};
  std::vector<Block> blocks_;
  Norm norm_{nullptr};
};

// A Decoder (models/model.h) over `net`, a DecoderImpl (gpt, llama): ModelKind::decoder.
std::unique_ptr<Decoder> cached_decoder(NetImpl& net, bool use_cache);

// The registered kind of a decoder model `Model` (its TORCH_MODULE holder) built from its
// `model.` keys `Options` (with block_size, its context length) and read and written in the
// Hugging Face layout `hf`: decodes token by token (cached_decoder), unties by
// model.tie_embeddings.
template <class Options, class Model>
ModelKind decoder_kind(ForeignFormat hf) {
  ModelKind kind;
  kind.make = [](const config::ModelConfig& cfg, const InputSpec& input) -> Net {
    return Model(cfg.own<Options>(), checkpoint_policy(cfg, /*has_blocks=*/true), input).ptr();
  };
  kind.context_length = [](const config::ModelConfig& cfg) {
    return cfg.own<Options>().block_size;
  };
  kind.hf = std::move(hf);
  kind.untie_hint = "model.tie_embeddings: false gives lm_head a weight of its own";
  kind.decoder = cached_decoder;
  return kind;
}

}  // namespace trainer::models
