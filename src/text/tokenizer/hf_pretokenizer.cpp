#include "text/tokenizer/hf_pretokenizer.h"

#include <array>

#include "text/unicode/unicode.h"

namespace trainer::data {
namespace {

// The classes of ASCII characters.
constexpr std::array<CharClass, 128> ascii_classes() {
  std::array<CharClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    t[c] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ? CharClass::kLetter
           : c >= '0' && c <= '9'                           ? CharClass::kNumber
           : (c >= 9 && c <= 13) || c == ' '                ? CharClass::kSpace
                                                            : CharClass::kOther;
  }
  return t;
}
constexpr auto kAscii = ascii_classes();

// One code point of the text: its class and length.
struct Char {
  char32_t c;
  CharClass k;
  size_t n;
};

inline Char char_at(const char* s, size_t size, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return {b, kAscii[b], 1};
  size_t n = 0;
  const char32_t c = decode_utf8(s, size, i, n);
  return {c, char_class(c), n};
}

// The end of the run of code points of class `k` from `i`; at most `most` code points.
inline size_t run_end(const char* s, size_t size, size_t i, CharClass k, size_t most = ~size_t{0}) {
  for (size_t count = 0; i < size && count < most; ++count) {
    const Char x = char_at(s, size, i);
    if (x.k != k) break;
    i += x.n;
  }
  return i;
}

inline bool is(char x, char lower) {
  return x == lower;
}
inline bool is_ci(char x, char lower) {
  return x == lower || x == lower - 'a' + 'A';
}

// The length of the contraction after an apostrophe at s[i] ('s 't 're 've 'm 'll 'd), with the
// apostrophe; 0 for none. Case-insensitive as (?i:...) in Oniguruma, where ſ (U+017F) is an s.
size_t contraction(const char* s, size_t size, size_t i, bool ignore_case) {
  const auto eq = [&](size_t k, char lower) {
    return i + k < size && (ignore_case ? is_ci(s[i + k], lower) : is(s[i + k], lower));
  };
  if (eq(1, 's') || eq(1, 't') || eq(1, 'm') || eq(1, 'd')) return 2;
  if ((eq(1, 'r') || eq(1, 'v')) && eq(2, 'e')) return 3;
  if (eq(1, 'l') && eq(2, 'l')) return 3;
  if (ignore_case && i + 2 < size && static_cast<unsigned char>(s[i + 1]) == 0xC5 &&
      static_cast<unsigned char>(s[i + 2]) == 0xBF) {
    return 3;  // 'ſ
  }
  return 0;
}

// \s+(?!\S)|\s+ from `i`, a space: the run of spaces, less its last code point when a non-space
// follows and the run has more than one (the lookahead gives it back to the next piece).
size_t spaces(const char* s, size_t size, size_t i) {
  size_t j = i, last = i;
  while (j < size) {
    const Char x = char_at(s, size, j);
    if (x.k != CharClass::kSpace) break;
    last = j;
    j += x.n;
  }
  if (j == size || last == i) return j - i;
  return last - i;
}

size_t gpt2_piece(const char* s, size_t size, size_t i) {
  const Char x = char_at(s, size, i);
  if (x.c == '\'') {
    const size_t m = contraction(s, size, i, /*ignore_case=*/false);
    if (m) return m;
  }
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': a run of one class, after an optional space.
  if (x.c == ' ' && i + 1 < size) {
    const Char y = char_at(s, size, i + 1);
    if (y.k != CharClass::kSpace) return run_end(s, size, i + 1, y.k) - i;
  }
  if (x.k != CharClass::kSpace) return run_end(s, size, i, x.k) - i;
  return spaces(s, size, i);
}

size_t llama3_piece(const char* s, size_t size, size_t i, size_t most_digits) {
  const Char x = char_at(s, size, i);
  if (x.c == '\'') {
    const size_t m = contraction(s, size, i, /*ignore_case=*/true);
    if (m) return m;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (x.k == CharClass::kLetter) return run_end(s, size, i, CharClass::kLetter) - i;
  if (x.c != '\r' && x.c != '\n' && x.k != CharClass::kNumber && i + x.n < size &&
      char_at(s, size, i + x.n).k == CharClass::kLetter) {
    return run_end(s, size, i + x.n, CharClass::kLetter) - i;
  }
  // \p{N}{1,3} (Qwen 2: \p{N})
  if (x.k == CharClass::kNumber) return run_end(s, size, i, CharClass::kNumber, most_digits) - i;
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t j = size;  // where the run of other characters starts, if there is one
  if (x.k == CharClass::kOther) {
    j = i;
  } else if (x.c == ' ' && i + 1 < size && char_at(s, size, i + 1).k == CharClass::kOther) {
    j = i + 1;
  }
  if (j < size) {
    j = run_end(s, size, j, CharClass::kOther);
    while (j < size && (s[j] == '\r' || s[j] == '\n')) ++j;
    return j - i;
  }
  // \s*[\r\n]+: the spaces up to the last newline among them.
  size_t end = i, newline_end = i;
  while (end < size) {
    const Char y = char_at(s, size, end);
    if (y.k != CharClass::kSpace) break;
    end += y.n;
    if (y.c == '\r' || y.c == '\n') newline_end = end;
  }
  if (newline_end > i) return newline_end - i;
  return spaces(s, size, i);
}

}  // namespace

std::optional<SplitPattern> split_pattern(const std::string& regex) {
  static const char* const kGpt2 =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  static const char* const kLlama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static const char* const kQwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (regex == kGpt2) return SplitPattern::kGpt2;
  if (regex == kLlama3) return SplitPattern::kLlama3;
  if (regex == kQwen2) return SplitPattern::kQwen2;
  return std::nullopt;
}

const char* split_pattern_name(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2:
      return "GPT-2";
    case SplitPattern::kLlama3:
      return "Llama 3";
    case SplitPattern::kQwen2:
      return "Qwen 2";
  }
  return "?";
}

size_t piece_length(SplitPattern pattern, const char* text, size_t size, size_t i) {
  switch (pattern) {
    case SplitPattern::kGpt2:
      return gpt2_piece(text, size, i);
    case SplitPattern::kLlama3:
      return llama3_piece(text, size, i, 3);
    case SplitPattern::kQwen2:
      return llama3_piece(text, size, i, 1);
  }
  return 1;
}

}  // namespace trainer::data
