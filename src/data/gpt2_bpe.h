// GPT-2's byte-level BPE tokenizer, from OpenAI's encoder.json and vocab.bpe (as tiktoken's
// "gpt2" encoding and Hugging Face's GPT2Tokenizer read them): the text split by GPT-2's
// pre-tokenizer pattern, each piece's bytes mapped to printable characters and merged by rank.
// Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace trainer::data {

class Gpt2Tokenizer {
 public:
  // Reads `dir`/encoder.json and `dir`/vocab.bpe. Throws DataError naming the file.
  explicit Gpt2Tokenizer(const std::string& dir);

  // The token ids of `text` (UTF-8 bytes; any bytes encode).
  std::vector<int64_t> encode(const std::string& text) const;
  // The bytes token `id` stands for; throws std::out_of_range for an unknown id.
  std::string decode(int64_t id) const;
  // The number of tokens (50257 for GPT-2: 50000 merges, 256 bytes, <|endoftext|>).
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

  // GPT-2's pieces of `text`: its pre-tokenizer pattern
  // '(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  static std::vector<std::string> pieces(const std::string& text);

 private:
  std::vector<int64_t> encode_piece(const std::string& piece) const;

  std::unordered_map<std::string, int64_t> ids_;    // token (mapped characters) -> id
  std::vector<std::string> tokens_;                 // id -> its bytes
  std::unordered_map<std::string, int64_t> ranks_;  // "a b" -> merge rank
  std::vector<std::string> byte_chars_;             // byte -> its printable character (UTF-8)
};

}  // namespace trainer::data
