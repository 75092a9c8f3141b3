#include "data/gpt2_bpe.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "data/dataset.h"
#include "util/unicode.h"

namespace trainer::data {
namespace {

// UTF-8 of code point c.
std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for 256 + n.
std::vector<std::string> byte_characters() {
  std::vector<std::string> out(256);
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    out[static_cast<size_t>(b)] =
        utf8(printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++));
  }
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw DataError(path +
                    ": cannot read (a GPT-2 tokenizer folder holds encoder.json and vocab.bpe)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The length in bytes of the run of code points from `i` that satisfy `pred`.
template <class Pred>
size_t run_of(const std::string& s, size_t i, Pred pred) {
  size_t j = i, n = 0;
  while (j < s.size() && pred(decode_utf8(s, j, n))) j += n;
  return j - i;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// The length of the piece of GPT-2's pattern that starts at `i` (at least 1).
size_t piece_at(const std::string& s, size_t i) {
  size_t n = 0;
  const char32_t c = decode_utf8(s, i, n);
  if (c == '\'') {
    for (const char* tail : {"ll", "ve", "re", "s", "d", "m", "t"}) {
      if (s.compare(i + 1, std::char_traits<char>::length(tail), tail) == 0) {
        return 1 + std::char_traits<char>::length(tail);
      }
    }
  }
  const auto other = [](char32_t x) { return !is_whitespace(x) && !is_letter(x) && !is_number(x); };
  const size_t space = c == ' ' ? 1 : 0;  // the optional leading space
  if (i + space < s.size()) {
    size_t m = 0;
    const char32_t d = decode_utf8(s, i + space, m);
    if (is_letter(d)) return space + run_of(s, i + space, is_letter);
    if (is_number(d)) return space + run_of(s, i + space, is_number);
    if (other(d)) return space + run_of(s, i + space, other);
  }
  // \s+(?!\S): whitespace not followed by a non-space, else \s+; then anything else alone.
  const size_t ws = run_of(s, i, is_whitespace);
  if (ws == 0) return n;
  if (i + ws >= s.size()) return ws;
  size_t last = ws, k = 0;  // the run without its last code point
  for (size_t j = i; j < i + ws; j += k) {
    decode_utf8(s, j, k);
    if (j + k == i + ws) last = j - i;
  }
  return last > 0 ? last : ws;
}

// encoder.json: token (mapped characters) -> id, with each id's bytes in `tokens` and the id of
// "<|endoftext|>" in `end_of_text`. Every byte must have a token. Throws DataError naming `path`.
std::unordered_map<std::string, int64_t> read_encoder(const std::string& path,
                                                      std::vector<std::string>& tokens,
                                                      int64_t& end_of_text) {
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path + ": not JSON: " + e.what());
  }
  if (!encoder.is_object() || encoder.empty()) {
    throw DataError(path + ": not a JSON object of tokens and their ids");
  }
  const auto byte_chars = byte_characters();
  std::unordered_map<std::string, unsigned char> byte_of;
  for (int b = 0; b < 256; ++b)
    byte_of[byte_chars[static_cast<size_t>(b)]] = static_cast<unsigned char>(b);
  std::unordered_map<std::string, int64_t> ids;
  // Ids name rows of the model's output: at most one per token, and none beyond the count.
  const auto most = static_cast<int64_t>(encoder.size());
  for (const auto& [token, id] : encoder.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      throw DataError(path + ": token '" + token + "' has no id");
    if (id.get<int64_t>() >= most) {
      throw DataError(path + ": token '" + token + "' has id " + std::to_string(id.get<int64_t>()) +
                      ", beyond its " + std::to_string(most) + " tokens (ids run from 0)");
    }
    const auto i = static_cast<size_t>(id.get<int64_t>());
    if (i >= tokens.size()) tokens.resize(i + 1);
    ids[token] = id.get<int64_t>();
    std::string bytes;  // the token's characters mapped back to bytes
    for (size_t k = 0, n = 0; k < token.size(); k += n) {
      decode_utf8(token, k, n);
      const auto it = byte_of.find(token.substr(k, n));
      bytes += it != byte_of.end() ? static_cast<char>(it->second) : '?';
    }
    tokens[i] = token == "<|endoftext|>" ? token : bytes;
    if (token == "<|endoftext|>") end_of_text = id.get<int64_t>();
  }
  // Every byte must have a token of its own: the encoding of any text starts from them.
  for (int b = 0; b < 256; ++b) {
    if (!ids.count(byte_chars[static_cast<size_t>(b)])) {
      throw DataError(path + ": no token for byte " + std::to_string(b) +
                      " (GPT-2's encoder.json has one for each of the 256 bytes)");
    }
  }
  return ids;
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) {
  const std::string enc_path = dir + "/encoder.json", bpe_path = dir + "/vocab.bpe";
  const auto ids = read_encoder(enc_path, tokens_, end_of_text_);
  const auto byte_chars = byte_characters();
  for (int b = 0; b < 256; ++b) byte_ids_.push_back(ids.at(byte_chars[static_cast<size_t>(b)]));
  std::istringstream lines(read_text(bpe_path));
  int32_t rank = 0;
  int64_t line_number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_number;
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const auto space = line.find(' ');
    const std::string a = line.substr(0, space),
                      b = space == std::string::npos ? "" : line.substr(space + 1);
    const auto ia = ids.find(a), ib = ids.find(b), iab = ids.find(a + b);
    if (space == std::string::npos || ia == ids.end() || ib == ids.end() || iab == ids.end()) {
      throw DataError(bpe_path + ":" + std::to_string(line_number) + ": the merge '" + line +
                      "' joins or makes a token that " + enc_path +
                      " lacks; use the encoder.json and vocab.bpe of one tokenizer");
    }
    merges_.emplace(pair_key(static_cast<int32_t>(ia->second), static_cast<int32_t>(ib->second)),
                    Merge{rank++, static_cast<int32_t>(iab->second)});
  }
  if (merges_.empty()) throw DataError(bpe_path + ": no merges");
}

std::vector<std::string> Gpt2Tokenizer::pieces(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    const size_t n = piece_at(text, i);
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

size_t Gpt2Tokenizer::piece_length(const std::string& text, size_t i) {
  return piece_at(text, i);
}

void Gpt2Tokenizer::encode_piece(const char* piece, size_t n, std::vector<int32_t>& out) const {
  std::vector<int32_t> parts(n);  // the symbols, as token ids
  for (size_t k = 0; k < n; ++k) parts[k] = byte_ids_[static_cast<unsigned char>(piece[k])];
  while (parts.size() > 1) {
    const Merge* best = nullptr;
    uint64_t best_key = 0;
    for (size_t k = 0; k + 1 < parts.size(); ++k) {
      const uint64_t key = pair_key(parts[k], parts[k + 1]);
      const auto it = merges_.find(key);
      if (it != merges_.end() && (!best || it->second.rank < best->rank)) {
        best = &it->second;
        best_key = key;
      }
    }
    if (!best) break;
    // Every occurrence of the best pair, left to right, becomes its merged token.
    size_t w = 0;
    for (size_t k = 0; k < parts.size();) {
      if (k + 1 < parts.size() && pair_key(parts[k], parts[k + 1]) == best_key) {
        parts[w++] = best->id;
        k += 2;
      } else {
        parts[w++] = parts[k++];
      }
    }
    parts.resize(w);
  }
  out.insert(out.end(), parts.begin(), parts.end());
}

void Gpt2Tokenizer::encode_into(const std::string& text, PieceCache& cache,
                                std::vector<int32_t>& out) const {
  std::string piece;
  for (size_t i = 0; i < text.size();) {
    const size_t n = piece_at(text, i);
    piece.assign(text, i, n);
    i += n;
    const auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      continue;
    }
    const size_t start = out.size();
    encode_piece(piece.data(), n, out);
    cache.emplace(
        piece, std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
  }
}

std::vector<int64_t> Gpt2Tokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < text.size();) {
    const size_t n = piece_at(text, i);
    encode_piece(text.data() + i, n, ids);
    i += n;
  }
  return {ids.begin(), ids.end()};
}

std::string Gpt2Tokenizer::decode(int64_t id) const {
  if (id < 0 || id >= size())
    throw std::out_of_range("GPT-2 token id " + std::to_string(id) + " out of range");
  return tokens_[static_cast<size_t>(id)];
}

}  // namespace trainer::data
