#include "text/tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <unordered_map>

#include "text/error.h"
#include "text/tokenizer/hf_added_tokens.h"
#include "text/tokenizer/hf_bpe.h"
#include "text/unicode/unicode.h"
#include "text/unicode/unicode_nfc.h"

namespace trainer::data {

struct BpeTokenizer::Impl {
  std::array<int32_t, 256> byte_ids{};
  MergeTable merges;
  BytesTable model_tokens;  // the model's tokens as spelled (a spelling's first id)
  BytesTable vocab_bytes;   // the model's tokens by their bytes (with ignore_merges)
  std::unordered_map<std::string, int64_t> added;  // added tokens (found before the model's)
  AddedTokenMatcher raw, normalized;  // added tokens matched before / after normalizing
};

namespace {

constexpr size_t kMaxCachedPiece = 256;  // bytes: longer pieces are not cached

// GPT-2's bytes_to_unicode: the code point standing for each byte; and back (-1: none).
struct ByteLevel {
  std::array<char32_t, 256> code{};
  std::array<int16_t, 324> byte{};
  ByteLevel() {
    byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      code[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
      byte[code[static_cast<size_t>(b)]] = static_cast<int16_t>(b);
    }
  }
};
const ByteLevel kByteLevel;

// The ByteLevel decoder on one token: its characters' bytes when each stands for a byte, else
// the token's own UTF-8. `mapped` tells which.
std::string byte_level_decode(const std::string& token, bool& mapped) {
  std::string out;
  for (size_t i = 0, n = 0; i < token.size(); i += n) {
    const char32_t c = decode_utf8(token, i, n);
    const bool valid = !(c == 0xFFFD && n == 1);
    if (!valid || c >= kByteLevel.byte.size() || kByteLevel.byte[c] < 0) {
      mapped = false;
      return token;
    }
    out += static_cast<char>(kByteLevel.byte[c]);
  }
  mapped = true;
  return out;
}

std::string byte_token(int b) {
  std::string s;
  append_utf8(s, kByteLevel.code[static_cast<size_t>(b)]);
  return s;
}

// Loading a big vocabulary is bound by the hash tables' cache misses: the slot of a key is
// fetched this many keys before the key is looked up.
constexpr size_t kAhead = 8;

uint64_t hash_of(std::string_view s) {
  return hash_bytes(s.data(), s.size());
}

}  // namespace

void BpeTokenizer::load_model(BpeSpec& spec, Impl& impl) {
  tokens_ = std::move(spec.vocab);
  const size_t n = tokens_.size();
  bytes_.resize(n);
  std::vector<uint64_t> hashes(n), byte_hashes(n);  // of the tokens, of their bytes
  std::vector<uint8_t> mapped(n, 0);                // whether their characters are bytes
  for (size_t id = 0; id < n; ++id) {
    bool m = false;
    bytes_[id] = byte_level_decode(tokens_[id], m);
    mapped[id] = m && !tokens_[id].empty() && ignore_merges_;
    hashes[id] = hash_of(tokens_[id]);
    if (mapped[id]) byte_hashes[id] = hash_of(bytes_[id]);
  }
  impl.model_tokens.reserve(n);
  if (ignore_merges_) impl.vocab_bytes.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    if (id + kAhead < n) {
      impl.model_tokens.prefetch(hashes[id + kAhead]);
      if (mapped[id + kAhead]) impl.vocab_bytes.prefetch(byte_hashes[id + kAhead]);
    }
    if (tokens_[id].empty()) continue;
    impl.model_tokens.insert(tokens_[id], hashes[id], static_cast<int32_t>(id));
    if (mapped[id]) impl.vocab_bytes.insert(bytes_[id], byte_hashes[id], static_cast<int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    const std::string token = byte_token(b);
    const int32_t id = impl.model_tokens.find(token, hash_of(token));
    if (id < 0) {
      throw TokenizerError(source_ + ": model.vocab has no token for byte " + std::to_string(b) +
                           " ('" + token + "'); a byte-level BPE vocabulary holds all 256");
    }
    impl.byte_ids[static_cast<size_t>(b)] = id;
  }
  load_merges(spec, impl);
}

void BpeTokenizer::load_merges(const BpeSpec& spec, Impl& impl) {
  const size_t n = spec.merges.size();
  struct Hashes {
    uint64_t left, right, joined;
  };
  std::string joined;
  const auto hashes_of = [&](size_t r) {
    const auto& [a, b] = spec.merges[r];
    joined.assign(a).append(b);
    const Hashes h{hash_of(a), hash_of(b), hash_of(joined)};
    for (const uint64_t x : {h.left, h.right, h.joined}) impl.model_tokens.prefetch(x);
    return h;
  };
  Hashes ahead[kAhead];
  for (size_t r = 0; r < std::min(n, kAhead); ++r) ahead[r] = hashes_of(r);
  std::vector<std::pair<int32_t, int32_t>> pairs(n);
  std::vector<int32_t> merged(n);
  for (size_t r = 0; r < n; ++r) {
    const Hashes h = ahead[r % kAhead];
    if (r + kAhead < n) ahead[r % kAhead] = hashes_of(r + kAhead);
    const auto& [a, b] = spec.merges[r];
    joined.assign(a).append(b);
    pairs[r] = {impl.model_tokens.find(a, h.left), impl.model_tokens.find(b, h.right)};
    merged[r] = impl.model_tokens.find(joined, h.joined);
    if (pairs[r].first < 0 || pairs[r].second < 0 || merged[r] < 0) {
      throw TokenizerError(source_ + ": model.merges[" + std::to_string(r) + "] '" + a + " " + b +
                           "' joins or makes a token that model.vocab lacks");
    }
  }
  impl.merges.build(pairs, merged);
}

void BpeTokenizer::load_added(const BpeSpec& spec, Impl& impl) {
  const auto model_size = static_cast<int64_t>(impl.model_tokens.size());
  std::unordered_map<std::string, int64_t> added;                 // as tokenizers' added_tokens_map
  int64_t most = -1;                                              // its largest id
  std::vector<AddedTokenMatcher::Pattern> raw[2], normalized[2];  // [0]: special, [1]: not
  for (const AddedToken& t : spec.added) {
    if (t.content.empty()) continue;
    // The id tokenizers gives it: its own if the vocabulary has the token, else the next one.
    int64_t id = -1;
    if (const auto it = added.find(t.content); it != added.end()) {
      id = it->second;
    } else if (const int32_t m = impl.model_tokens.find(
                   t.content, hash_bytes(t.content.data(), t.content.size()));
               m >= 0) {
      id = m;
    } else {
      id = most < 0 ? model_size : (most >= model_size || model_size == 0 ? most + 1 : model_size);
    }
    if (id != t.id) {
      throw TokenizerError(source_ + ": added_tokens: '" + t.content + "' has id " +
                           std::to_string(t.id) + ", but tokenizers gives it " +
                           std::to_string(id) + " (after the vocabulary's " +
                           std::to_string(model_size) + " tokens)");
    }
    added[t.content] = id;
    most = std::max(most, id);
    if (static_cast<size_t>(id) >= tokens_.size()) {
      tokens_.resize(static_cast<size_t>(id) + 1);
      bytes_.resize(static_cast<size_t>(id) + 1);
    }
    tokens_[static_cast<size_t>(id)] = t.content;
    bool mapped = false;
    bytes_[static_cast<size_t>(id)] = byte_level_decode(t.content, mapped);
    special_.resize(tokens_.size());
    special_[static_cast<size_t>(id)] = t.special;
    AddedTokenMatcher::Pattern p{t.normalized && nfc_ ? nfc(t.content) : t.content, id, t.special,
                                 t.lstrip, t.rstrip};
    (t.normalized ? normalized : raw)[t.special ? 0 : 1].push_back(p);
    if (t.lstrip || t.content.find('\n') != std::string::npos) cuts_at_newlines_ = false;
  }
  special_.resize(tokens_.size());
  for (auto* set : {raw, normalized}) set[0].insert(set[0].end(), set[1].begin(), set[1].end());
  impl.raw = AddedTokenMatcher(raw[0]);
  impl.normalized = AddedTokenMatcher(normalized[0]);
  impl.added = std::move(added);
}

BpeTokenizer::BpeTokenizer(BpeSpec spec)
    : source_(spec.source),
      pattern_(spec.pattern),
      nfc_(spec.nfc),
      ignore_merges_(spec.ignore_merges) {
  auto impl = std::make_shared<Impl>();
  load_model(spec, *impl);
  load_added(spec, *impl);
  impl_ = impl;
  bos_ = spec.bos.empty() ? -1 : token_to_id(spec.bos);
  eos_ = spec.eos.empty() ? -1 : token_to_id(spec.eos);
  added_bos_ = spec.added_bos.empty() ? -1 : token_to_id(spec.added_bos);
}

int64_t BpeTokenizer::token_to_id(const std::string& token) const {
  if (const auto it = impl_->added.find(token); it != impl_->added.end()) return it->second;
  return impl_->model_tokens.find(token, hash_bytes(token.data(), token.size()));
}

const std::string& BpeTokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id >= vocab_size()) {
    throw std::out_of_range(source_ + ": token id " + std::to_string(id) + " out of range (" +
                            std::to_string(vocab_size()) + " tokens)");
  }
  return tokens_[static_cast<size_t>(id)];
}

const std::string& BpeTokenizer::token_bytes(int64_t id) const {
  id_to_token(id);  // the range check
  return bytes_[static_cast<size_t>(id)];
}

bool BpeTokenizer::is_special(int64_t id) const {
  return id >= 0 && id < vocab_size() && special_[static_cast<size_t>(id)];
}

int64_t BpeTokenizer::end_of_text() const {
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>"}) {
    const int64_t id = token_to_id(name);
    if (id >= 0) return id;
  }
  return eos_;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (const int64_t id : ids) out += token_bytes(id);
  return out;
}

void BpeTokenizer::encode_piece(std::string_view piece, PieceCache* cache,
                                std::vector<int32_t>& out) const {
  const Impl& impl = *impl_;
  if (piece.size() == 1) {
    out.push_back(impl.byte_ids[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const uint64_t hash = hash_bytes(piece.data(), piece.size());
  if (ignore_merges_) {
    const int32_t id = impl.vocab_bytes.find(piece, hash);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (piece.size() > kMaxCachedPiece) cache = nullptr;  // rare, and costly to hold
  if (cache) {
    size_t count = 0;
    if (const int32_t* ids = cache->find(piece, hash, count)) {
      out.insert(out.end(), ids, ids + count);
      return;
    }
  }
  const size_t start = out.size();
  impl.merges.merge(piece, impl.byte_ids.data(), out);
  if (cache) cache->insert(piece, hash, out.data() + start, out.size() - start);
}

void BpeTokenizer::encode_pieces(std::string_view text, PieceCache* cache,
                                 std::vector<int32_t>& out) const {
  for (size_t i = 0; i < text.size();) {
    const size_t n = piece_length(pattern_, text.data(), text.size(), i);
    encode_piece(text.substr(i, n), cache, out);
    i += n;
  }
}

// Text between the added tokens found before normalizing: normalized, its own added tokens
// split out, the rest pre-tokenized.
void BpeTokenizer::encode_part(std::string_view part, bool allow_special, PieceCache* cache,
                               std::vector<int32_t>& out) const {
  std::string normalized;
  if (nfc_ && !nfc_quick_check(part)) {
    normalized = nfc(part);
    part = normalized;
  }
  const AddedTokenMatcher& matcher = impl_->normalized;
  if (matcher.empty(allow_special)) return encode_pieces(part, cache, out);
  std::vector<AddedTokenMatcher::Split> splits;
  matcher.split(part, allow_special, splits);
  for (const auto& s : splits) {
    if (s.id >= 0) {
      out.push_back(static_cast<int32_t>(s.id));
    } else {
      encode_pieces(part.substr(s.begin, s.end - s.begin), cache, out);
    }
  }
}

void BpeTokenizer::encode_into(std::string_view text, bool allow_special, PieceCache* cache,
                               std::vector<int32_t>& out) const {
  const AddedTokenMatcher& matcher = impl_->raw;
  if (matcher.empty(allow_special)) return encode_part(text, allow_special, cache, out);
  std::vector<AddedTokenMatcher::Split> splits;
  matcher.split(text, allow_special, splits);
  for (const auto& s : splits) {
    if (s.id >= 0) {
      out.push_back(static_cast<int32_t>(s.id));
    } else {
      encode_part(text.substr(s.begin, s.end - s.begin), allow_special, cache, out);
    }
  }
}

std::vector<int64_t> BpeTokenizer::encode(const std::string& text, bool allow_special) const {
  std::vector<int32_t> ids;
  encode_into(text, allow_special, nullptr, ids);
  return {ids.begin(), ids.end()};
}

const int32_t* BpeTokenizer::PieceCache::find(std::string_view piece, uint64_t hash,
                                              size_t& count) const {
  if (slots_.empty()) return nullptr;
  const size_t mask = slots_.size() - 1;
  for (size_t i = first_slot(hash, mask);; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return nullptr;
    if (s.hash == hash && s.key_length == piece.size() &&
        std::memcmp(keys_.data() + s.key, piece.data(), piece.size()) == 0) {
      count = s.count;
      return ids_.data() + s.ids;
    }
  }
}

void BpeTokenizer::PieceCache::grow() {
  std::vector<Slot> old(std::max<size_t>(slots_.size() * 2, 1024));
  old.swap(slots_);
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.hash == 0) continue;
    size_t i = first_slot(s.hash, mask);
    while (slots_[i].hash != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void BpeTokenizer::PieceCache::insert(std::string_view piece, uint64_t hash, const int32_t* ids,
                                      size_t count) {
  if ((used_ + 1) * 2 > slots_.size()) grow();
  const size_t mask = slots_.size() - 1;
  size_t i = first_slot(hash, mask);
  while (slots_[i].hash != 0) i = (i + 1) & mask;
  slots_[i] = {hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(piece.size()),
               static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(count)};
  keys_.append(piece);
  ids_.insert(ids_.end(), ids, ids + count);
  ++used_;
}

void BpeTokenizer::PieceCache::clear() {
  slots_.clear();
  keys_.clear();
  ids_.clear();
  used_ = 0;
}

}  // namespace trainer::data
