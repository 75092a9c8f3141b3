#include "data/tokens/json_array.h"

namespace trainer::data {
namespace {

constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";

bool space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

// A cursor over the file's bytes that knows its line and column.
struct Scanner {
  std::string_view text;
  const std::string& file;
  size_t at = 0;
  int64_t line = 1;
  size_t line_start = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw JsonArrayError(file + ":" + std::to_string(line) + ":" +
                         std::to_string(at - line_start + 1) + ": " + what);
  }
  bool done() const { return at >= text.size(); }
  char peek() const { return text[at]; }
  void advance() {
    if (text[at] == '\n') {
      ++line;
      line_start = at + 1;
    }
    ++at;
  }
  void skip_space() {
    while (!done() && space(peek())) advance();
  }

  // A string, from its opening quote past its closing one.
  void skip_string() {
    advance();
    while (!done()) {
      const char c = peek();
      if (c == '\n') fail("a line break inside a string (a string without its closing '\"'?)");
      advance();
      if (c == '"') return;
      if (c == '\\' && !done()) advance();
    }
    fail("the file ends inside a string");
  }

  // An object or array from its opening bracket past the one that closes it, a string, or
  // another scalar (a number, true, false, null); `start_line` is the element's, for the message
  // of a file that ends inside it.
  void skip_value(int64_t start_line) {
    const char first = peek();
    if (first == '"') return skip_string();
    if (first != '{' && first != '[') {
      while (!done() && !space(peek()) && peek() != ',' && peek() != ']' && peek() != '}') {
        advance();
      }
      return;
    }
    std::string closers;
    for (;;) {
      if (done()) {
        fail("the file ends inside the element that starts on line " + std::to_string(start_line) +
             " (a missing '" + closers.back() + "'?)");
      }
      const char c = peek();
      if (c == '"') {
        skip_string();
        continue;
      }
      if (c == '{' || c == '[') {
        closers.push_back(c == '{' ? '}' : ']');
      } else if ((c == '}' || c == ']') && closers.back() != c) {
        fail(std::string("'") + c + "' where '" + closers.back() + "' closes what is open");
      } else if (c == '}' || c == ']') {
        closers.pop_back();
      }
      advance();
      if (closers.empty()) return;
    }
  }
};

}  // namespace

bool starts_json_array(std::string_view text) {
  if (text.substr(0, kByteOrderMark.size()) == kByteOrderMark) {
    text.remove_prefix(kByteOrderMark.size());
  }
  for (const char c : text) {
    if (!space(c)) return c == '[';
  }
  return false;
}

std::vector<JsonArrayElement> json_array_elements(std::string_view text, const std::string& file) {
  Scanner s{text, file};
  if (text.substr(0, kByteOrderMark.size()) == kByteOrderMark) {
    s.at = s.line_start = kByteOrderMark.size();
  }
  s.skip_space();
  if (s.done() || s.peek() != '[') s.fail("expected a JSON array, '['");
  s.advance();
  std::vector<JsonArrayElement> out;
  s.skip_space();
  bool open = s.done() || s.peek() != ']';
  if (!open) s.advance();
  while (open) {
    s.skip_space();
    if (s.done()) s.fail("the file ends before the array's closing ']'");
    if (s.peek() == ']' || s.peek() == ',') {
      s.fail(out.empty() ? "an element is missing before this"
                         : "an element is missing after ',' (a comma too many?)");
    }
    const size_t start = s.at;
    const int64_t line = s.line;
    s.skip_value(line);
    out.push_back({text.substr(start, s.at - start), line, static_cast<int64_t>(out.size())});
    s.skip_space();
    if (s.done()) s.fail("the file ends before the array's closing ']'");
    if (s.peek() != ',' && s.peek() != ']') {
      s.fail("expected ',' or ']' after the element that starts on line " + std::to_string(line) +
             " (a missing comma?)");
    }
    open = s.peek() == ',';
    s.advance();
  }
  s.skip_space();
  if (!s.done()) {
    s.fail(
        "text after the array's closing ']'; a JSON array file holds one array (JSON Lines: "
        "one record per line)");
  }
  return out;
}

}  // namespace trainer::data
