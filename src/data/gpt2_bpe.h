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

  // Pieces already encoded, for encoding much text: each thread keeps its own.
  using PieceCache = std::unordered_map<std::string, std::vector<int32_t>>;
  // Appends the token ids of `text` to `out`, looking each piece up in `cache` first (and adding
  // it); the same ids as encode().
  void encode_into(const std::string& text, PieceCache& cache, std::vector<int32_t>& out) const;

  // The id of "<|endoftext|>"; -1 when the vocabulary has none.
  int64_t end_of_text() const { return end_of_text_; }
  // The bytes token `id` stands for; throws std::out_of_range for an unknown id.
  std::string decode(int64_t id) const;
  // The number of tokens (50257 for GPT-2: 50000 merges, 256 bytes, <|endoftext|>).
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

  // GPT-2's pieces of `text`: its pre-tokenizer pattern
  // '(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  static std::vector<std::string> pieces(const std::string& text);
  // The length in bytes of the piece that starts at byte `i` of `text` (at least 1).
  static size_t piece_length(const std::string& text, size_t i);

 private:
  // Appends the ids of one piece: its bytes' tokens, then the merges by rank, each applied to
  // every occurrence of its pair from the left.
  void encode_piece(const char* piece, size_t n, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;  // id -> its bytes
  std::vector<int32_t> byte_ids_;    // byte -> its token's id
  struct Merge {
    int32_t rank = 0;
    int32_t id = 0;  // the merged token's
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  int64_t end_of_text_ = -1;
};

}  // namespace trainer::data
