// Unicode code points: UTF-8 decoding and the classes a regular expression's \p{L}, \p{N} and
// \s name (the GPT-2 pre-tokenizer's). Torch-free.
#pragma once

#include <cstddef>
#include <string>

namespace trainer {

// The code point at s[i], and in `length` its UTF-8 length (1 for a malformed byte, taken as
// U+FFFD).
char32_t decode_utf8(const std::string& s, size_t i, size_t& length);

bool is_letter(char32_t c);      // \p{L}: Lu, Ll, Lt, Lm, Lo
bool is_number(char32_t c);      // \p{N}: Nd, Nl, No
bool is_whitespace(char32_t c);  // \s: Unicode's White_Space

}  // namespace trainer
