// --tokenizer PATH of the commands: a byte-level BPE tokenizer (text/tokenizer/hf_tokenizer.h), a
// kind not built being a usage error.
#pragma once

#include <cstdint>
#include <string>

#include "cli/commands.h"
#include "text/tokenizer/hf_tokenizer.h"

namespace trainer::cli {

// The tokenizer of `path` (a tokenizer.json file, a folder holding one, or a folder with GPT-2's
// encoder.json and vocab.bpe). Throws UsageError for a tokenizer of a kind not built (exit 2),
// DataError for a missing or inconsistent file (exit 1).
inline data::BpeTokenizer load_tokenizer_or_usage(const std::string& path) {
  try {
    return data::load_tokenizer(path);
  } catch (const data::TokenizerUnsupported& e) {
    throw UsageError(std::string("--tokenizer: ") + e.what());
  }
}

// UsageError unless a model of `vocabulary` tokens (its embedding's rows) holds every id of a
// tokenizer of `tokenizer_vocabulary` ids (one more than its largest; 0: unknown): a larger id
// is an IndexError in transformers' first forward and garbage here. `what` names the tokenizer
// (its option and path). generate and export --format hf check this.
inline void require_vocabulary_holds(int64_t vocabulary, int64_t tokenizer_vocabulary,
                                     const std::string& what) {
  if (vocabulary >= tokenizer_vocabulary) return;
  throw UsageError(what + ": the model's vocabulary has " + std::to_string(vocabulary) +
                   " tokens, fewer than the tokenizer's " + std::to_string(tokenizer_vocabulary) +
                   "; give the tokenizer the model was trained with");
}

}  // namespace trainer::cli
