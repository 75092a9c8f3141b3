// Reading and checking a config file's YAML text: unreadable and binary files, tabs, syntax errors
// in plain words, several documents, aliases that expand without end, and duplicate keys.

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "config/loader_internal.h"

namespace trainer::config::detail {

namespace fs = std::filesystem;

namespace {

// A problem with file `display` as a whole: no line, no key.
void file_issue(std::vector<Issue>& issues, const std::string& display, const std::string& msg) {
  Issue issue;
  issue.where.file = display;
  issue.message = msg;
  issues.push_back(std::move(issue));
}

// Index of the first byte that makes `text` not UTF-8 text, or npos.
size_t first_binary_byte(const std::string& text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      if (c == 0 || (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) return i;
      ++i;
      continue;
    }
    size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || c == 0xC0 || c == 0xC1 || c > 0xF4 || i + len > n) return i;
    for (size_t k = 1; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string::npos;
}

void line_col(const std::string& text, size_t pos, int& line, int& col) {
  line = 1;
  col = 1;
  for (size_t i = 0; i < pos && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::string cur;
  for (char c : text) {
    if (c == '\n') {
      if (!cur.empty() && cur.back() == '\r') cur.pop_back();
      lines.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  lines.push_back(cur);
  return lines;
}

// True when the text holds nothing but whitespace, comments and document markers.
bool is_blank_yaml(const std::string& text) {
  for (const auto& line : split_lines(text)) {
    size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line[i] == '#') continue;
    std::string rest = line.substr(i);
    while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\t')) rest.pop_back();
    if (rest == "---" || rest == "...") continue;
    return false;
  }
  return true;
}

// 1-based line and column of the first tab used as indentation, or line 0.
std::pair<int, int> first_tab_indent(const std::string& text) {
  auto lines = split_lines(text);
  for (size_t l = 0; l < lines.size(); ++l) {
    const auto& line = lines[l];
    size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line[i] == '#') continue;
    size_t tab = line.find('\t');
    if (tab != std::string::npos && tab < i)
      return {static_cast<int>(l + 1), static_cast<int>(tab + 1)};
  }
  return {0, 0};
}

std::string parse_error_message(const std::string& msg) {
  if (msg == "end of map not found")
    return "bad indentation: this key is not aligned with the keys above it";
  if (msg == "illegal map value")
    return "bad indentation or a stray ':' (a 'key: value' line cannot have a more indented key "
           "under it; quote values that contain ': ')";
  if (msg == "end of sequence flow not found") return "a '[' list is not closed with ']'";
  if (msg == "end of map flow not found") return "a '{' mapping is not closed with '}'";
  if (msg == "illegal EOF in scalar") return "a quoted string is not closed";
  return "invalid YAML: " + msg;
}

// The nodes of `n` with every alias expanded, counted up to `limit` (then limit + 1): a few
// hundred bytes of aliases of aliases expand to billions.
size_t expanded_nodes(const YAML::Node& n, size_t limit) {
  size_t count = 1;
  if (n.IsMap()) {
    for (const auto& kv : n) {
      if (count > limit) break;
      count += expanded_nodes(kv.second, limit - count + 1);
    }
  } else if (n.IsSequence()) {
    for (const auto& item : n) {
      if (count > limit) break;
      count += expanded_nodes(item, limit - count + 1);
    }
  }
  return count;
}

}  // namespace

std::optional<std::string> read_text(const std::string& display, std::vector<Issue>& issues) {
  std::error_code ec;
  const fs::path p(display);
  const auto st = fs::status(p, ec);
  if (ec || !fs::exists(st))
    return file_issue(issues, display, "cannot read the config file: no such file"), std::nullopt;
  if (fs::is_directory(st))
    return file_issue(issues, display, "is a directory, not a config file"), std::nullopt;
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    file_issue(issues, display,
               std::string("cannot read the config file: ") + std::strerror(errno));
    return std::nullopt;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return file_issue(issues, display, "cannot read the config file"), std::nullopt;
  std::string text = ss.str();
  if (text.size() >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
  return text;
}

bool check_text(const std::string& display, const std::string& text, std::vector<Issue>& issues) {
  const size_t bad = first_binary_byte(text);
  if (bad != std::string::npos) {
    int line, col;
    line_col(text, bad, line, col);
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(text[bad]));
    issues.push_back(Issue{{display, line, col},
                           "",
                           std::string("not a text YAML file (byte ") + hex +
                               " is not UTF-8 text); expected a mapping of config keys"});
    return false;
  }
  if (is_blank_yaml(text)) {
    file_issue(issues, display, "the file is empty; expected a mapping of config keys");
    return false;
  }
  const auto [tab_line, tab_col] = first_tab_indent(text);
  if (tab_line > 0) {
    issues.push_back(Issue{
        {display, tab_line, tab_col}, "", "tabs are not allowed for indentation; use spaces"});
    return false;
  }
  return true;
}

std::optional<YAML::Node> parse_root(const std::string& display, const std::string& text,
                                     const Ctx& ctx) {
  std::vector<Issue>& issues = *ctx.issues;
  YAML::Node root;
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(text);
    if (docs.size() > 1) {
      file_issue(issues, display,
                 "holds " + std::to_string(docs.size()) +
                     " YAML documents ('---'); expected a single mapping of config keys");
      return std::nullopt;
    }
    if (!docs.empty()) root = docs.front();
  } catch (const YAML::Exception& e) {
    Location loc{display, 0, 0};
    if (!e.mark.is_null() && e.mark.line >= 0) loc = {display, e.mark.line + 1, e.mark.column + 1};
    issues.push_back(Issue{loc, "", parse_error_message(e.msg)});
    return std::nullopt;
  } catch (const std::exception& e) {
    file_issue(issues, display, std::string("invalid YAML: ") + e.what());
    return std::nullopt;
  }
  if (!root.IsDefined() || root.IsNull()) {
    file_issue(issues, display, "the file is empty; expected a mapping of config keys");
    return std::nullopt;
  }
  if (!root.IsMap()) {
    issues.push_back(
        Issue{ctx.at(root.Mark()), "",
              "expected a mapping of config keys at the top level, got " + describe(root)});
    return std::nullopt;
  }
  constexpr size_t kMaxNodes = 1000000;
  if (expanded_nodes(root, kMaxNodes) > kMaxNodes) {
    file_issue(issues, display,
               "expands to more than 1,000,000 YAML nodes (aliases of aliases); a config holds a "
               "few hundred keys: write the values out");
    return std::nullopt;
  }
  return root;
}

void find_duplicates(const YAML::Node& n, const std::string& prefix, const Ctx& ctx) {
  if (n.IsMap()) {
    std::map<std::string, YAML::Mark> seen;
    for (const auto& kv : n) {
      const YAML::Node key = kv.first;
      std::string child = prefix;
      if (key.IsScalar()) {
        const std::string& k = key.Scalar();
        child = prefix.empty() ? k : prefix + "." + k;
        auto [pos, inserted] = seen.emplace(k, key.Mark());
        if (!inserted) {
          std::string first = pos->second.is_null()
                                  ? ""
                                  : " (first at line " + std::to_string(pos->second.line + 1) + ")";
          ctx.issue(key.Mark(), child, "duplicate key '" + k + "'" + first);
        }
      }
      find_duplicates(kv.second, child, ctx);
    }
  } else if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i) find_duplicates(n[i], prefix, ctx);
  }
}

}  // namespace trainer::config::detail
