// The pre-tokenizers of byte-level BPE tokenizers: the regular expressions that cut text into the
// pieces BPE encodes one by one (GPT-2's, Llama 3's and Qwen 2's, as tokenizer.json spells them),
// each matched by hand exactly as the backtracking regex engine of Hugging Face's `tokenizers`
// (Oniguruma) splits: alternatives tried in order, greedy runs given back where the rest needs
// it (`\s+(?!\S)`, `\s*[\r\n]+`). Torch-free.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace trainer::data {

enum class SplitPattern {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
  // \s*[\r\n]+|\s+(?!\S)|\s+   (Llama 3's, tiktoken's cl100k_base)
  kLlama3,
  // Llama 3's with \p{N} for \p{N}{1,3}: one digit a piece (Qwen 2, 2.5 and 3)
  kQwen2,
};

// The pattern a tokenizer.json Split regex spells; nullopt for any other regex.
std::optional<SplitPattern> split_pattern(const std::string& regex);

// "GPT-2", "Llama 3" or "Qwen 2".
const char* split_pattern_name(SplitPattern pattern);

// The length in bytes of the piece that starts at byte `i` of text[0, size) (i < size; at least
// 1). The text ends at `size` as the regex sees it: `\s+(?!\S)` takes trailing spaces whole.
// Malformed UTF-8 bytes count as U+FFFD, one piece character each.
size_t piece_length(SplitPattern pattern, const char* text, size_t size, size_t i);

}  // namespace trainer::data
