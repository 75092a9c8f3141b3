// GPT-2's byte-level BPE tokenizer from OpenAI's encoder.json and vocab.bpe (as tiktoken's "gpt2"
// encoding and Hugging Face's GPT2Tokenizer read them): one case of the byte-level BPE tokenizers
// of hf_tokenizer.h, with GPT-2's pre-tokenizer pattern and <|endoftext|> as its special token.
// Torch-free.
#pragma once

#include <string>

#include "text/tokenizer/hf_tokenizer.h"

namespace trainer::data {

// The spec of `dir`/encoder.json and `dir`/vocab.bpe. Throws DataError naming the file that is
// missing, not JSON, or inconsistent (an id beyond the tokens, a byte without a token, a merge of
// tokens the encoder lacks).
BpeSpec read_gpt2_bpe(const std::string& dir);

}  // namespace trainer::data
