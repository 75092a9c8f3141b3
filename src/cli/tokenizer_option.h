// --tokenizer PATH of the commands: a byte-level BPE tokenizer (data/hf_tokenizer.h), a kind not
// built being a usage error.
#pragma once

#include <string>

#include "cli/commands.h"
#include "data/hf_tokenizer.h"

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

}  // namespace trainer::cli
