#include "util/unicode.h"

#include <algorithm>
#include <iterator>

namespace trainer {
namespace {

struct CodeRange {
  char32_t first, last;
};

#include "util/unicode_classes.inc"

template <size_t N>
bool in(const CodeRange (&table)[N], char32_t c) {
  const auto it = std::upper_bound(std::begin(table), std::end(table), c,
                                   [](char32_t v, const CodeRange& r) { return v < r.first; });
  return it != std::begin(table) && c <= std::prev(it)->last;
}

}  // namespace

char32_t decode_utf8(const std::string& s, size_t i, size_t& length) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char b0 = byte(0);
  const size_t n = b0 < 0x80         ? 1
                   : (b0 >> 5) == 6  ? 2
                   : (b0 >> 4) == 14 ? 3
                   : (b0 >> 3) == 30 ? 4
                                     : 0;
  if (n == 0 || i + n > s.size()) {
    length = 1;
    return 0xFFFD;
  }
  char32_t c = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < n; ++k) {
    if ((byte(k) & 0xC0) != 0x80) {
      length = 1;
      return 0xFFFD;
    }
    c = (c << 6) | (byte(k) & 0x3F);
  }
  length = n;
  return c;
}

bool is_letter(char32_t c) {
  return in(kLetters, c);
}

bool is_number(char32_t c) {
  return in(kNumbers, c);
}

bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

}  // namespace trainer
