// The description of a token file that `trainer tokenize` writes beside it: FILE.json (train.bin:
// train.bin.json), one JSON object
//
//   {"format": "trainer-tokens", "version": 1, "dtype": "uint32", "tokens": 1234567,
//    "vocab_size": 151669, "documents": 12, "end_of_text": 151643,
//    "tokenizer": {"path": "/models/Qwen3-0.6B/tokenizer.json", "xxh64": "9f0c..."}}
//
// dtype is the width of the little-endian ids (uint16 or uint32), tokens their number (the file
// holds tokens x width bytes), vocab_size the tokenizer's (every id is below it), and tokenizer
// its file's path and the xxh64 of its bytes (tokenizer.json; GPT-2's encoder.json then
// vocab.bpe). The `tokens` data set reads it to know the width and to check the file. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace trainer::data {

class BpeTokenizer;

struct TokenSidecar {
  std::string dtype = "uint16";  // uint16 | uint32
  int64_t tokens = 0;
  int64_t vocab_size = 0;
  int64_t documents = 0;
  int64_t end_of_text = -1;  // the id between documents; -1: none
  std::string tokenizer_path;
  std::string tokenizer_xxh64;

  int64_t width() const { return dtype == "uint32" ? 4 : 2; }
};

// The sidecar's path for `token_file`: its name with ".json" added.
std::string token_sidecar_path(const std::string& token_file);

// The identity of `tokenizer`: its file's absolute path and the xxh64 of its bytes (for GPT-2's
// encoder.json, followed by vocab.bpe's), into `out`. Throws DataError when they cannot be read.
void describe_tokenizer(const BpeTokenizer& tokenizer, TokenSidecar& out);

// Writes the sidecar of `token_file` atomically. Throws IoError.
void write_token_sidecar(const std::string& token_file, const TokenSidecar& sidecar);

// The sidecar of `token_file`, or nullopt when there is none. Throws DataConfigError("data.root")
// naming the sidecar when it is not one (not JSON, a key missing or of the wrong kind, an unknown
// dtype).
std::optional<TokenSidecar> read_token_sidecar(const std::string& token_file);

}  // namespace trainer::data
