#include "text/unicode/unicode.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace trainer {
namespace {

struct CodeRange {
  char32_t first, last;
};

#include "text/unicode/unicode_classes.inc"

template <size_t N>
bool in(const CodeRange (&table)[N], char32_t c) {
  const auto it = std::upper_bound(std::begin(table), std::end(table), c,
                                   [](char32_t v, const CodeRange& r) { return v < r.first; });
  return it != std::begin(table) && c <= std::prev(it)->last;
}

CharClass class_by_search(char32_t c) {
  return in(kLetters, c)    ? CharClass::kLetter
         : in(kNumbers, c)  ? CharClass::kNumber
         : is_whitespace(c) ? CharClass::kSpace
                            : CharClass::kOther;
}

// The classes of U+0000..U+FFFF.
const std::array<CharClass, 0x10000>& bmp_classes() {
  static const auto table = [] {
    std::array<CharClass, 0x10000> t{};
    for (char32_t c = 0; c < 0x10000; ++c) t[c] = class_by_search(c);
    return t;
  }();
  return table;
}

}  // namespace

char32_t decode_utf8(const char* s, size_t size, size_t i, size_t& length) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char b0 = byte(0);
  const size_t n = b0 < 0x80         ? 1
                   : (b0 >> 5) == 6  ? 2
                   : (b0 >> 4) == 14 ? 3
                   : (b0 >> 3) == 30 ? 4
                                     : 0;
  if (n == 0 || i + n > size) {
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

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string valid_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  for (size_t i = 0; i < s.size();) {
    const unsigned char b0 = at(i);
    // The sequence's length and the range its second byte must lie in (Unicode's table 3-7).
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 < 0x80)
      n = 1;
    else if (b0 >= 0xC2 && b0 <= 0xDF)
      n = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF)
      n = 3, lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    else if (b0 >= 0xF0 && b0 <= 0xF4)
      n = 4, lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;  // bytes of a well-formed prefix
    for (; n > 1 && k < n && i + k < s.size(); ++k) {
      const unsigned char b = at(i + k);
      if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) break;
    }
    if (n != 0 && k == n) {
      out.append(s, i, n);
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal subpart
    }
    i += n == 0 ? 1 : k;
  }
  return out;
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

CharClass char_class(char32_t c) {
  return c < 0x10000 ? bmp_classes()[c] : class_by_search(c);
}

}  // namespace trainer
