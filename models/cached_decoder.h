// Token-by-token decoding of the built-in decoder-only models (gpt, llama), with or without a
// key/value cache: what the models' `ModelKind::decoder` returns.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "models/decoder.h"
#include "models/model.h"

namespace trainer::models {

// A Decoder over a DecoderImpl: its forward(ids [B, T]) -> logits [B, T, vocab] without a cache,
// its forward_cached(ids [B, T], start, caches) with one.
class CachedDecoder final : public Decoder {
 public:
  CachedDecoder(DecoderImpl& net, bool use_cache) : net_(net), use_cache_(use_cache) {}

  torch::Tensor next_logits(const torch::Tensor& tokens) override {
    torch::NoGradGuard no_grad;
    history_ = history_.defined() ? torch::cat({history_, tokens}, /*dim=*/1) : tokens;  // [B, L]
    const int64_t context = net_.block_size();
    if (!use_cache_) {
      history_ = history_.slice(/*dim=*/1, std::max<int64_t>(0, history_.size(1) - context));
      return net_.forward(history_).select(/*dim=*/1, /*index=*/-1);  // [B, vocab]
    }
    if (cached_ + tokens.size(1) > context) {  // full: the last context - 1 tokens, recomputed
      history_ = history_.slice(/*dim=*/1, history_.size(1) - (context - 1));
      caches_.clear();
      cached_ = 0;
    }
    // The cache takes new tokens one at a time once it holds any (the causal mask of a longer
    // block after a cache is not what scaled_dot_product_attention's is_causal means).
    if (cached_ == 0) {
      cached_ = history_.size(1);
      return net_.forward_cached(history_, /*start=*/0, caches_);  // [B, vocab]
    }
    torch::Tensor logits;
    for (int64_t t = 0; t < tokens.size(1); ++t) {
      logits = net_.forward_cached(tokens.slice(/*dim=*/1, t, t + 1), cached_++, caches_);
    }
    return logits;  // [B, vocab]
  }

  int64_t vocabulary() const override { return net_.vocabulary(); }

  void reset() override {
    history_ = torch::Tensor();
    caches_.clear();
    cached_ = 0;
  }

 private:
  DecoderImpl& net_;
  bool use_cache_;
  torch::Tensor history_;              // [B, L] every token given since reset(), cropped
  std::vector<KeyValueCache> caches_;  // per block
  int64_t cached_ = 0;                 // positions in the caches
};

}  // namespace trainer::models
