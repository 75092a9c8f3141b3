// Text files to a token file of the `tokens` data set (trainer tokenize): a byte-level BPE
// tokenizer (hf_tokenizer.h) over many threads. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer/hf_tokenizer.h"

namespace trainer::data {

// Where `text` can be cut into chunks of about `chunk` bytes without changing its pieces (after a
// newline between two printable ASCII characters): the chunks' end offsets, the last the text's
// size; one chunk when there is no such place.
std::vector<size_t> chunk_ends(const std::string& text, size_t chunk);

// Encodes documents on `threads` threads, each with its own piece cache, kept from one document
// to the next.
class ParallelEncoder {
 public:
  // allow_special: special tokens written in the text are matched (else encoded as text).
  ParallelEncoder(const BpeTokenizer& tokenizer, int threads, bool allow_special);

  // The token ids of each of `texts`: the same as tokenizer.encode(text, allow_special). The
  // texts' chunks (chunk_ends, when the tokenizer cuts at newlines) are shared out over the
  // threads.
  std::vector<std::vector<int32_t>> encode(const std::vector<std::string>& texts);

 private:
  const BpeTokenizer& tokenizer_;
  int threads_;
  bool allow_special_;
  std::vector<BpeTokenizer::PieceCache> caches_;  // one per thread
};

// What tokenize_files wrote.
struct TokenizeResult {
  int64_t tokens = 0;     // written, end-of-text tokens included
  int64_t documents = 0;  // the files
  int64_t bytes = 0;      // of text read
  int width = 2;          // bytes per token
  std::string sidecar;    // the description written beside the token file (token_sidecar.h)
};

// Writes the tokens of `files` (each one document, read whole, up to 64 MB of them at a time) to
// `out` (atomically) as little-endian integers of `width` bytes (2: uint16, nanoGPT's .bin; 4:
// uint32), the tokenizer's end_of_text() between documents; then `out`.json beside it
// (atomically; text/tokens/token_sidecar.h): the width, the number of tokens, the vocabulary size
// and the tokenizer's identity, from which the `tokens` data set reads the file. Throws DataError
// naming a file that cannot be read, or a tokenizer without an end-of-text token when there are
// several documents; IoError when `out` or its sidecar cannot be written.
TokenizeResult tokenize_files(const BpeTokenizer& tokenizer, const std::vector<std::string>& files,
                              const std::string& out, int width, int threads,
                              bool allow_special = false);

}  // namespace trainer::data
