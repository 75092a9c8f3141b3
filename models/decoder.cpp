#include "models/decoder.h"

#include "models/cached_decoder.h"

namespace trainer::models {

int64_t decoder_vocabulary(const std::string& model, int64_t vocab_size, const InputSpec& input) {
  const int64_t vocab = vocab_size > 0 ? vocab_size : input.num_classes;
  if (vocab <= 0) throw ModelError("model.vocab_size", model + " needs a vocabulary size > 0");
  return vocab;
}

void check_token_input(int64_t block_size, int64_t vocab_size, const InputSpec& input) {
  const int64_t seq_len = input.sample_shape.size() == 1 ? input.sample_shape[0] : 0;
  if (seq_len > block_size) {
    throw ModelError("data.seq_len", "data.seq_len " + std::to_string(seq_len) +
                                         " exceeds model.block_size " + std::to_string(block_size) +
                                         "; use 0 to take the block size");
  }
  if (vocab_size > 0 && vocab_size < input.num_classes) {
    throw ModelError("model.vocab_size",
                     "the token data has ids up to " + std::to_string(input.num_classes - 1) +
                         ", beyond model.vocab_size " + std::to_string(vocab_size) +
                         "; use 0 to take the data's vocabulary");
  }
}

std::unique_ptr<Decoder> cached_decoder(NetImpl& net, bool use_cache) {
  return std::make_unique<CachedDecoder>(dynamic_cast<DecoderImpl&>(net), use_cache);
}

}  // namespace trainer::models
