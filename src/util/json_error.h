// nlohmann::json's errors as the trainer's messages: without the library's "[json.exception...]"
// tag, a syntax error's place as FILE:LINE:COLUMN.
#pragma once

#include <exception>
#include <string>

namespace trainer {

// e's text less its "[json.exception.KIND.N] " tag and, for a syntax error, its "parse error at
// line L, column C: " (set into `line` and `column`, else left as they are).
inline std::string json_error_text(const std::exception& e, std::string* line = nullptr,
                                   std::string* column = nullptr) {
  std::string what = e.what();
  if (what.rfind("[json.exception.", 0) == 0) {
    const size_t tag = what.find("] ");
    if (tag != std::string::npos) what = what.substr(tag + 2);
  }
  const std::string at = "at line ";
  const size_t l = what.find(at);
  const size_t c = l == std::string::npos ? l : what.find(", column ", l);
  const size_t end = c == std::string::npos ? c : what.find(": ", c);
  if (end == std::string::npos) return what;
  if (line) *line = what.substr(l + at.size(), c - l - at.size());
  if (column) *column = what.substr(c + 9, end - c - 9);
  return what.substr(end + 2);
}

// "PATH:LINE:COLUMN: not JSON: why" (or "PATH: not JSON: why" where the error has no place).
inline std::string not_json_message(const std::string& path, const std::exception& e) {
  std::string line, column;
  const std::string why = json_error_text(e, &line, &column);
  return path + (line.empty() ? "" : ":" + line + ":" + column) + ": not JSON: " + why;
}

}  // namespace trainer
