#include "text/unicode/unicode_nfc.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <vector>

#include "text/unicode/unicode.h"

namespace trainer {
namespace {

struct CodeRange {
  char32_t first, last;
};
struct CombiningClass {
  char32_t cp;
  uint8_t value;
};
struct Decomposition {
  char32_t cp;
  uint16_t first;
  uint8_t length;
};
struct Composition {
  char32_t first, second, composite;
};

#include "text/unicode/unicode_nfc_tables.inc"

// Hangul syllables: Unicode's algorithm (chapter 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

bool unstable_by_search(char32_t c) {
  const auto it = std::upper_bound(std::begin(kNfcUnstable), std::end(kNfcUnstable), c,
                                   [](char32_t v, const CodeRange& r) { return v < r.first; });
  return it != std::begin(kNfcUnstable) && c <= std::prev(it)->last;
}

// Whether a code point is not NFC-stable on its own (kNfcUnstable), from a bit table for the
// Basic Multilingual Plane.
bool unstable(char32_t c) {
  static const auto bits = [] {
    std::array<uint64_t, 0x10000 / 64> b{};
    for (char32_t x = 0; x < 0x10000; ++x) {
      if (unstable_by_search(x)) b[x / 64] |= uint64_t{1} << (x % 64);
    }
    return b;
  }();
  if (c < 0x300) return false;
  return c < 0x10000 ? (bits[c / 64] >> (c % 64)) & 1 : unstable_by_search(c);
}

uint8_t combining_class(char32_t c) {
  if (c < 0x300) return 0;
  const auto it = std::lower_bound(std::begin(kCombiningClasses), std::end(kCombiningClasses), c,
                                   [](const CombiningClass& e, char32_t v) { return e.cp < v; });
  return it != std::end(kCombiningClasses) && it->cp == c ? it->value : 0;
}

// Appends the full canonical decomposition of `c` to `out`.
void decompose(char32_t c, std::vector<char32_t>& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), c,
                                   [](const Decomposition& e, char32_t v) { return e.cp < v; });
  if (it == std::end(kDecompositions) || it->cp != c) {
    out.push_back(c);
    return;
  }
  out.insert(out.end(), kDecomposed + it->first, kDecomposed + it->first + it->length);
}

// The primary composite of `a` and `b`; 0 when there is none.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto it =
      std::lower_bound(std::begin(kCompositions), std::end(kCompositions), std::make_pair(a, b),
                       [](const Composition& e, const std::pair<char32_t, char32_t>& v) {
                         return e.first != v.first ? e.first < v.first : e.second < v.second;
                       });
  return it != std::end(kCompositions) && it->first == a && it->second == b ? it->composite : 0;
}

// Canonical ordering: each run of marks sorted stably by combining class.
void reorder(std::vector<char32_t>& cps) {
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(
        cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j),
        [](char32_t x, char32_t y) { return combining_class(x) < combining_class(y); });
    i = j;
  }
}

// Canonical composition of decomposed, ordered code points (UAX #15's algorithm; marks before
// the first starter stay as they are).
void recompose(std::vector<char32_t>& cps) {
  bool have_starter = false;
  size_t starter = 0, write = 0;
  int last_class = 0;  // of the last code point kept after the starter; 0: none
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const int cls = combining_class(c);
    if (have_starter && (last_class == 0 || last_class < cls)) {
      const char32_t composite = compose(cps[starter], c);
      if (composite != 0) {
        cps[starter] = composite;
        continue;
      }
    }
    if (cls == 0) {
      starter = write;
      have_starter = true;
    }
    last_class = cls;
    cps[write++] = c;
  }
  cps.resize(write);
}

// Appends the NFC of the valid code points s[begin, end) to `out`.
void normalize_span(std::string_view s, size_t begin, size_t end, std::string& out) {
  std::vector<char32_t> cps;
  for (size_t i = begin, n = 0; i < end; i += n)
    decompose(decode_utf8(s.data(), s.size(), i, n), cps);
  reorder(cps);
  recompose(cps);
  for (const char32_t c : cps) append_utf8(out, c);
}

}  // namespace

bool nfc_quick_check(std::string_view s) {
  for (size_t i = 0, n = 1; i < s.size(); i += n) {
    if (static_cast<unsigned char>(s[i]) < 0xCC) {  // below U+0300
      n = 1;
      continue;
    }
    if (unstable(decode_utf8(s.data(), s.size(), i, n))) return false;
  }
  return true;
}

std::string nfc(std::string_view s) {
  if (nfc_quick_check(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t copied = 0;   // s[0, copied) is in `out`
  size_t starter = 0;  // where the code point before `i` starts, when a starter of the next run
  bool have_starter = false;
  for (size_t i = 0, n = 0; i < s.size();) {
    const char32_t c = decode_utf8(s.data(), s.size(), i, n);
    if (!unstable(c)) {
      starter = i;
      have_starter = !(c == 0xFFFD && n == 1);  // a malformed byte stays as it is
      i += n;
      continue;
    }
    // A run of unstable code points, with the stable one before it (a starter they may join).
    size_t j = i;
    for (size_t m = 0; j < s.size(); j += m) {
      if (!unstable(decode_utf8(s.data(), s.size(), j, m))) break;
    }
    const size_t begin = have_starter ? starter : i;
    out.append(s.substr(copied, begin - copied));
    normalize_span(s, begin, j, out);
    copied = j;
    i = j;
    have_starter = false;
  }
  out.append(s.substr(copied));
  return out;
}

}  // namespace trainer
