// trainer generate: sampling tokens from a language model's decoder (models::Decoder), one at a
// time, as nanoGPT's sample.py and Hugging Face's generate() do.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "models/model.h"

namespace trainer::engine {

struct SamplingOptions {
  int64_t max_new_tokens = 256;  // tokens generated after the prompt
  double temperature = 1.0;      // logits divided by this first; 0 = always the likeliest token
  int64_t top_k = 0;             // then only the k likeliest tokens; 0 = all
  double top_p = 1.0;            // then the fewest likeliest tokens holding this probability
  uint64_t seed = 0;             // the sampling's random numbers
  // Tokens that end the text once drawn (the model's eos ids, Hugging Face's eos_token_id): the
  // token is given to on_token and generation stops. None: max_new_tokens tokens.
  std::vector<int64_t> stop_ids;
};

// The next token of each row of `logits` [B, V] (float32 on any device): temperature, then top-k,
// then top-p (Hugging Face's rule: the first token past p stays in), then a draw with
// `generator`. Returns [B] int64 on the CPU. Synchronises the device.
torch::Tensor sample_next(const torch::Tensor& logits, const SamplingOptions& options,
                          at::Generator& generator);

// Continues `prompt` [1, T] (int64 ids) by options.max_new_tokens tokens, or fewer when one of
// options.stop_ids is drawn (it is the last), calling `on_token` with each as it is drawn (the
// first after the whole prompt is read, the others after one position each with the decoder's
// cache). Returns the new tokens. Synchronises the device once per token.
std::vector<int64_t> generate(models::Decoder& decoder, const torch::Tensor& prompt,
                              const SamplingOptions& options, at::Generator& generator,
                              const std::function<void(int64_t token)>& on_token);

}  // namespace trainer::engine
