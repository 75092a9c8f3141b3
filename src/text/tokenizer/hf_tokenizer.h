// Byte-level BPE tokenizers as Hugging Face's `tokenizers` runs them (GPT-2, Llama 3, Qwen 2/3):
// added and special tokens split out first (non-normalized ones on the text, then NFC when the
// tokenizer normalizes, then normalized ones), the pre-tokenizer's pieces (hf_pretokenizer.h),
// each piece's bytes merged by the BPE merges (a whole piece found in the vocabulary is one token
// with `ignore_merges`), and ByteLevel decoding. Read from tokenizer.json (hf_tokenizer_json.cpp)
// or from GPT-2's encoder.json and vocab.bpe (gpt2_bpe.h). Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/tokenizer/hf_pretokenizer.h"

namespace trainer::data {

// Thrown for a tokenizer of a kind not built (another model type, a normalizer that changes
// text, byte fallback, an unknown pre-tokenizer pattern): the message names the file and the
// field. Commands report it as a usage error (exit 2); unreadable or inconsistent files are
// DataError (exit 1).
class TokenizerUnsupported : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// An added token of tokenizer.json's added_tokens.
struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = false;
  bool lstrip = false;      // takes the whitespace before it
  bool rstrip = false;      // takes the whitespace after it
  bool normalized = false;  // matched in the normalized text
};

// What a tokenizer is made of, as read from its files.
struct BpeSpec {
  std::string source;  // the file, for messages
  // The model's tokens by id, in the ByteLevel alphabet (GPT-2's bytes_to_unicode); "" for an
  // id without a token.
  std::vector<std::string> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // by rank
  bool ignore_merges = false;
  SplitPattern pattern = SplitPattern::kGpt2;
  bool nfc = false;  // the normalizer: NFC, or none
  std::vector<AddedToken> added;
  std::string bos, eos;   // tokens named by tokenizer_config.json or the post-processor; "" if none
  std::string added_bos;  // the token the post-processor puts before the text; "" if none
};

// A loaded tokenizer: immutable, so its const methods may run on many threads at once (each
// with its own PieceCache); copies share the tables.
class BpeTokenizer {
 public:
  // Builds the tables; throws DataError naming spec.source for a merge of tokens the vocabulary
  // lacks, a byte without a token, or an added token whose id disagrees with the vocabulary.
  explicit BpeTokenizer(BpeSpec spec);

  // Pieces already encoded, for encoding much text: one per thread.
  class PieceCache;

  // The token ids of `text` (UTF-8; malformed bytes encode as themselves): as tokenizers'
  // Tokenizer.encode(text, add_special_tokens=False).ids. With allow_special false, special
  // tokens written in the text are encoded as text (encode_special_tokens=True); added tokens
  // that are not special still match.
  std::vector<int64_t> encode(const std::string& text, bool allow_special = true) const;
  // Appends the ids of `text` to `out`, looking pieces up in `cache` first (and adding them)
  // unless it is null.
  void encode_into(std::string_view text, bool allow_special, PieceCache* cache,
                   std::vector<int32_t>& out) const;

  // The bytes of `ids` (ByteLevel decoding, special tokens as their text: tokenizers'
  // decode(ids, skip_special_tokens=False) before it replaces malformed UTF-8 with U+FFFD; see
  // valid_utf8). Throws std::out_of_range for an id without a token.
  std::string decode(const std::vector<int64_t>& ids) const;
  // The bytes of one token ("" for an id in range without a token); throws std::out_of_range.
  const std::string& token_bytes(int64_t id) const;

  // The id of a token as tokenizer.json spells it (an added token's content, or a model token
  // in the ByteLevel alphabet); -1 when there is none.
  int64_t token_to_id(const std::string& token) const;
  // The token of `id` as tokenizer.json spells it; throws std::out_of_range.
  const std::string& id_to_token(int64_t id) const;
  bool is_special(int64_t id) const;
  // One more than the largest id.
  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  // The beginning- and end-of-sequence tokens (tokenizer_config.json's bos_token and eos_token,
  // else the post-processor's first token for bos); -1 when unknown.
  int64_t bos_id() const { return bos_; }
  int64_t eos_id() const { return eos_; }
  // The token tokenizers' encode(add_special_tokens=True) puts before the text (its
  // TemplateProcessing post-processor's: Llama 3's <|begin_of_text|>); -1 when none.
  int64_t added_bos_id() const { return added_bos_; }
  // The token put between documents: <|endoftext|> (GPT-2, Qwen), <|end_of_text|> (Llama 3),
  // else eos; -1 when there is none.
  int64_t end_of_text() const;
  // Whether text cut after a newline between two printable ASCII characters encodes as the
  // parts do (no added token holds a newline or takes the whitespace before it).
  bool cuts_at_newlines() const { return cuts_at_newlines_; }
  SplitPattern pattern() const { return pattern_; }
  // Whether text is normalized (NFC) before it is pre-tokenized.
  bool normalizes_nfc() const { return nfc_; }
  const std::string& source() const { return source_; }

 private:
  struct Impl;
  void load_model(BpeSpec& spec, Impl& impl);  // takes spec.vocab
  void load_merges(const BpeSpec& spec, Impl& impl);
  void load_added(const BpeSpec& spec, Impl& impl);
  void encode_part(std::string_view part, bool allow_special, PieceCache* cache,
                   std::vector<int32_t>& out) const;
  void encode_pieces(std::string_view text, PieceCache* cache, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, PieceCache* cache, std::vector<int32_t>& out) const;

  std::string source_;
  SplitPattern pattern_ = SplitPattern::kGpt2;
  bool nfc_ = false;
  bool ignore_merges_ = false;
  std::vector<std::string> tokens_;  // id -> token as spelled
  std::vector<std::string> bytes_;   // id -> decoded bytes
  std::vector<uint8_t> special_;     // id -> 1 for a special added token
  int64_t bos_ = -1, eos_ = -1, added_bos_ = -1;
  bool cuts_at_newlines_ = true;
  std::shared_ptr<const Impl> impl_;  // hash tables, the added-token matchers
};

// Pieces already encoded and their ids (a hash table over arenas). Not thread-safe: one per
// thread.
class BpeTokenizer::PieceCache {
 public:
  // The ids of `piece` (hash: hash_bytes of it) and their number in `count`; nullptr if absent.
  const int32_t* find(std::string_view piece, uint64_t hash, size_t& count) const;
  void insert(std::string_view piece, uint64_t hash, const int32_t* ids, size_t count);
  // The pieces held.
  size_t size() const { return used_; }
  void clear();

 private:
  struct Slot {
    uint64_t hash = 0;  // 0: empty
    uint32_t key = 0, key_length = 0, ids = 0, count = 0;
  };
  void grow();
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t used_ = 0;
};

// The tokenizer of `path`: a tokenizer.json file, a folder holding one (a Hugging Face model
// folder; its tokenizer_config.json names bos and eos), or a folder with GPT-2's encoder.json and
// vocab.bpe. Throws TokenizerUnsupported for a kind not built, DataError for a missing, unreadable
// or inconsistent file.
BpeTokenizer load_tokenizer(const std::string& path);

// The spec of a tokenizer.json file (`config`: its folder's tokenizer_config.json, or "" for
// none). Throws as load_tokenizer.
BpeSpec read_tokenizer_json(const std::string& path, const std::string& config);

}  // namespace trainer::data
