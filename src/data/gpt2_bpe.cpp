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

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) : byte_chars_(byte_characters()) {
  const std::string enc_path = dir + "/encoder.json", bpe_path = dir + "/vocab.bpe";
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_text(enc_path));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(enc_path + ": not JSON: " + e.what());
  }
  std::unordered_map<std::string, unsigned char> byte_of;
  for (int b = 0; b < 256; ++b)
    byte_of[byte_chars_[static_cast<size_t>(b)]] = static_cast<unsigned char>(b);
  if (!encoder.is_object() || encoder.empty()) {
    throw DataError(enc_path + ": not a JSON object of tokens and their ids");
  }
  // Ids name rows of the model's output: at most one per token, and none beyond the count.
  const auto most = static_cast<int64_t>(encoder.size());
  for (const auto& [token, id] : encoder.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      throw DataError(enc_path + ": token '" + token + "' has no id");
    if (id.get<int64_t>() >= most) {
      throw DataError(enc_path + ": token '" + token + "' has id " +
                      std::to_string(id.get<int64_t>()) + ", beyond its " + std::to_string(most) +
                      " tokens (ids run from 0)");
    }
    const auto i = static_cast<size_t>(id.get<int64_t>());
    if (i >= tokens_.size()) tokens_.resize(i + 1);
    ids_[token] = id.get<int64_t>();
    std::string bytes;  // the token's characters mapped back to bytes
    for (size_t k = 0, n = 0; k < token.size(); k += n) {
      decode_utf8(token, k, n);
      const auto it = byte_of.find(token.substr(k, n));
      bytes += it != byte_of.end() ? static_cast<char>(it->second) : '?';
    }
    tokens_[i] = token == "<|endoftext|>" ? token : bytes;
  }
  // Every byte must have a token of its own: the encoding of any text starts from them.
  for (int b = 0; b < 256; ++b) {
    if (!ids_.count(byte_chars_[static_cast<size_t>(b)])) {
      throw DataError(enc_path + ": no token for byte " + std::to_string(b) +
                      " (GPT-2's encoder.json has one for each of the 256 bytes)");
    }
  }
  std::istringstream merges(read_text(bpe_path));
  int64_t rank = 0;
  for (std::string line; std::getline(merges, line);) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    ranks_[line] = rank++;
  }
  if (ranks_.empty()) throw DataError(bpe_path + ": no merges");
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

std::vector<int64_t> Gpt2Tokenizer::encode_piece(const std::string& piece) const {
  std::vector<std::string> parts;  // symbols, as mapped characters
  for (unsigned char b : piece) parts.push_back(byte_chars_[b]);
  while (parts.size() > 1) {
    int64_t best = std::numeric_limits<int64_t>::max();
    size_t at = 0;
    for (size_t k = 0; k + 1 < parts.size(); ++k) {
      const auto it = ranks_.find(parts[k] + " " + parts[k + 1]);
      if (it != ranks_.end() && it->second < best) best = it->second, at = k;
    }
    if (best == std::numeric_limits<int64_t>::max()) break;
    const std::string a = parts[at], b = parts[at + 1];
    std::vector<std::string> merged;  // every occurrence of (a, b), left to right
    for (size_t k = 0; k < parts.size(); ++k) {
      if (k + 1 < parts.size() && parts[k] == a && parts[k + 1] == b) {
        merged.push_back(a + b);
        ++k;
      } else {
        merged.push_back(parts[k]);
      }
    }
    parts = std::move(merged);
  }
  std::vector<int64_t> ids;
  for (const auto& p : parts) {
    const auto it = ids_.find(p);
    // A merge whose result has no id (an inconsistent vocab.bpe): its bytes' own tokens.
    if (it != ids_.end()) {
      ids.push_back(it->second);
    } else {
      for (size_t k = 0, n = 0; k < p.size(); k += n) {
        decode_utf8(p, k, n);
        ids.push_back(ids_.at(p.substr(k, n)));
      }
    }
  }
  return ids;
}

std::vector<int64_t> Gpt2Tokenizer::encode(const std::string& text) const {
  std::vector<int64_t> out;
  for (const auto& piece : pieces(text)) {
    const auto ids = encode_piece(piece);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

std::string Gpt2Tokenizer::decode(int64_t id) const {
  if (id < 0 || id >= size())
    throw std::out_of_range("GPT-2 token id " + std::to_string(id) + " out of range");
  return tokens_[static_cast<size_t>(id)];
}

}  // namespace trainer::data
