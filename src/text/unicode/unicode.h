// Unicode code points: UTF-8 decoding and encoding, and the classes a regular expression's \p{L},
// \p{N} and \s name (the pre-tokenizers' of byte-level BPE tokenizers). Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace trainer {

// The code point at s[i] (i < size), and in `length` its UTF-8 length (1 for a malformed byte,
// taken as U+FFFD).
char32_t decode_utf8(const char* s, size_t size, size_t i, size_t& length);
inline char32_t decode_utf8(const std::string& s, size_t i, size_t& length) {
  return decode_utf8(s.data(), s.size(), i, length);
}

// Appends the UTF-8 of code point `c` to `out`.
void append_utf8(std::string& out, char32_t c);

// `s` with every malformed UTF-8 sequence (each maximal subpart of one) replaced by U+FFFD, as
// Rust's String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace") do.
std::string valid_utf8(const std::string& s);

bool is_letter(char32_t c);      // \p{L}
bool is_number(char32_t c);      // \p{N}
bool is_whitespace(char32_t c);  // \s: Unicode's White_Space

// A code point's class for the pre-tokenizers: exactly one of these.
enum class CharClass : uint8_t { kOther, kLetter, kNumber, kSpace };
// is_letter, is_number, is_whitespace in one look-up (a table for the Basic Multilingual Plane).
CharClass char_class(char32_t c);

}  // namespace trainer
