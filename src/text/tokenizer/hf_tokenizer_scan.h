// A fast strict JSON reader for tokenizer.json files: it gives a SAX handler (nlohmann's SAX
// interface: null, boolean, number_unsigned, number_integer, number_float, string, key,
// start_object, end_object, start_array, end_array) the events nlohmann's own parser would give
// for the same text, several times faster (strings are copied in runs, not byte by byte). It
// takes only what nlohmann takes; on anything else, and on what it leaves to nlohmann (a
// byte-order mark, an integer beyond 64 bits, nesting deeper than kMaxDepth), it returns false
// and the caller reads the text again with nlohmann's parser, which gives the error message.
// Torch-free.
#pragma once

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace trainer::data {

template <class Sax>
class JsonScanner {
 public:
  static constexpr int kMaxDepth = 512;

  JsonScanner(std::string_view text, Sax& sax)
      : p_(text.data()), end_(text.data() + text.size()), sax_(sax) {}

  // Whether the text is one JSON value (whitespace around it) and the handler took each event.
  bool scan() {
    skip_space();
    if (!value(0)) return false;
    skip_space();
    return p_ == end_;
  }

 private:
  // Bytes copied as they are inside a string: printable ASCII but for '"' and '\\'.
  static constexpr std::array<bool, 256> kPlain = [] {
    std::array<bool, 256> plain{};
    for (int c = 0x20; c < 0x80; ++c) plain[static_cast<size_t>(c)] = c != '"' && c != '\\';
    return plain;
  }();

  void skip_space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  bool literal(std::string_view word) {
    if (static_cast<size_t>(end_ - p_) < word.size() || std::string_view(p_, word.size()) != word)
      return false;
    p_ += word.size();
    return true;
  }

  bool value(int depth) {
    if (p_ == end_) return false;
    switch (*p_) {
      case '{':
        return object(depth + 1);
      case '[':
        return array(depth + 1);
      case '"':
        return string(buf_) && sax_.string(buf_);
      case 't':
        return literal("true") && sax_.boolean(true);
      case 'f':
        return literal("false") && sax_.boolean(false);
      case 'n':
        return literal("null") && sax_.null();
      default:
        return number();
    }
  }

  bool object(int depth) {
    if (depth > kMaxDepth || !sax_.start_object(static_cast<std::size_t>(-1))) return false;
    ++p_;
    skip_space();
    if (p_ < end_ && *p_ == '}') {
      ++p_;
      return sax_.end_object();
    }
    while (true) {
      if (p_ == end_ || *p_ != '"' || !string(buf_) || !sax_.key(buf_)) return false;
      skip_space();
      if (p_ == end_ || *p_ != ':') return false;
      ++p_;
      skip_space();
      if (!value(depth)) return false;
      skip_space();
      if (p_ == end_) return false;
      if (*p_ == '}') {
        ++p_;
        return sax_.end_object();
      }
      if (*p_++ != ',') return false;
      skip_space();
    }
  }

  bool array(int depth) {
    if (depth > kMaxDepth || !sax_.start_array(static_cast<std::size_t>(-1))) return false;
    ++p_;
    skip_space();
    if (p_ < end_ && *p_ == ']') {
      ++p_;
      return sax_.end_array();
    }
    while (true) {
      if (!value(depth)) return false;
      skip_space();
      if (p_ == end_) return false;
      if (*p_ == ']') {
        ++p_;
        return sax_.end_array();
      }
      if (*p_++ != ',') return false;
      skip_space();
    }
  }

  // The string at p_ (its opening quote) into `out`, unescaped: copied in runs between escapes.
  bool string(std::string& out) {
    out.clear();
    const char* run = ++p_;
    while (true) {
      while (p_ < end_ && kPlain[static_cast<unsigned char>(*p_)]) ++p_;
      if (p_ == end_) return false;
      const auto c = static_cast<unsigned char>(*p_);
      if (c >= 0x80) {
        if (!utf8()) return false;
        continue;
      }
      out.append(run, static_cast<size_t>(p_ - run));
      if (c == '"') {
        ++p_;
        return true;
      }
      if (c != '\\' || !escape(out)) return false;  // a control character, a bad escape
      run = p_;
    }
  }

  // Steps over one UTF-8 sequence (RFC 3629: no overlong forms, no surrogates, at most
  // U+10FFFF).
  bool utf8() {
    const auto at = [this](ptrdiff_t i) { return static_cast<unsigned char>(p_[i]); };
    const auto c = at(0);
    int n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c >= 0xC2 && c <= 0xDF) {
      n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (end_ - p_ < n || at(1) < lo || at(1) > hi) return false;
    for (int i = 2; i < n; ++i) {
      if (at(i) < 0x80 || at(i) > 0xBF) return false;
    }
    p_ += n;
    return true;
  }

  bool hex4(uint32_t& v) {
    if (end_ - p_ < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = *p_++;
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return false;
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return true;
  }

  bool escape(std::string& out) {
    if (end_ - p_ < 2) return false;
    const char e = p_[1];
    p_ += 2;
    switch (e) {
      case '"':
        out += '"';
        return true;
      case '\\':
        out += '\\';
        return true;
      case '/':
        out += '/';
        return true;
      case 'b':
        out += '\b';
        return true;
      case 'f':
        out += '\f';
        return true;
      case 'n':
        out += '\n';
        return true;
      case 'r':
        out += '\r';
        return true;
      case 't':
        out += '\t';
        return true;
      case 'u':
        break;
      default:
        return false;
    }
    uint32_t code = 0;
    if (!hex4(code) || (code >= 0xDC00 && code <= 0xDFFF)) return false;
    if (code >= 0xD800 && code <= 0xDBFF) {  // a high surrogate: its low one must follow
      uint32_t low = 0;
      if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return false;
      p_ += 2;
      if (!hex4(low) || low < 0xDC00 || low > 0xDFFF) return false;
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    }
    append_utf8(out, code);
    return true;
  }

  static void append_utf8(std::string& out, uint32_t c) {
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

  // A number as JSON writes one: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?. nlohmann's
  // kinds: an integer without sign is unsigned, with one signed; else a double.
  bool number() {
    const char* start = p_;
    const auto digits = [this] {
      const char* from = p_;
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      return p_ - from;
    };
    const bool negative = p_ < end_ && *p_ == '-';
    if (negative) ++p_;
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
    if (*p_ == '0') {
      ++p_;
    } else {
      digits();
    }
    bool integer = true;
    if (p_ < end_ && *p_ == '.') {
      ++p_;
      if (digits() == 0) return false;
      integer = false;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (digits() == 0) return false;
      integer = false;
    }
    if (integer) {  // beyond 64 bits (nlohmann makes a double of it): left to nlohmann
      if (negative) {
        int64_t v = 0;
        const auto r = std::from_chars(start, p_, v);
        return r.ec == std::errc() && r.ptr == p_ && sax_.number_integer(v);
      }
      uint64_t v = 0;
      const auto r = std::from_chars(start, p_, v);
      return r.ec == std::errc() && r.ptr == p_ && sax_.number_unsigned(v);
    }
    double v = 0;
    const auto r = std::from_chars(start, p_, v);
    return r.ec == std::errc() && r.ptr == p_ &&
           sax_.number_float(v, std::string(start, static_cast<size_t>(p_ - start)));
  }

  const char* p_;
  const char* end_;
  Sax& sax_;
  std::string buf_;
};

}  // namespace trainer::data
