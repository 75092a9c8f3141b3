// Loading, merging, validating and printing the run configuration (see loader.h).
//
// Everything generic walks the structs' `visit` methods, so a new field in config.h needs no
// change here: FieldApplier applies YAML to a field, Emitter prints it, PathCollector lists keys.

#include "config/loader.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

namespace trainer::config {

namespace fs = std::filesystem;

// ------------------------------------------------------------------------------------------------
// Location, Issue, ConfigError, LoadedConfig

std::string Location::str() const {
  if (line <= 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

std::string Issue::str() const {
  std::string s = where.str() + ": ";
  if (!key.empty()) s += key + ": ";
  return s + message;
}

namespace {

std::string join_issues(const std::vector<Issue>& issues) {
  std::string s;
  for (size_t i = 0; i < issues.size(); ++i) {
    if (i) s += '\n';
    s += issues[i].str();
  }
  return s;
}

}  // namespace

ConfigError::ConfigError(std::vector<Issue> issues)
    : std::runtime_error(join_issues(issues)), issues_(std::move(issues)) {}

Location LoadedConfig::where(const std::string& key) const {
  auto it = origins.find(key);
  if (it != origins.end()) return it->second;
  return Location{source, 0, 0};
}

namespace {

// ------------------------------------------------------------------------------------------------
// Type traits and small helpers

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

template <class T>
constexpr bool is_section_v =
    std::is_class_v<T> && !std::is_same_v<T, std::string> && !is_vector<T>::value;

// Optimal string alignment distance (Levenshtein plus adjacent transpositions).
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

std::string last_component(const std::string& path) {
  auto pos = path.rfind('.');
  return pos == std::string::npos ? path : path.substr(pos + 1);
}

size_t suggestion_limit(const std::string& word) {
  return std::max<size_t>(1, std::min<size_t>(3, word.size() / 3 + 1));
}

// The closest candidate to `path` (compared whole, or by its last component), or "".
std::string closest(const std::string& path, const std::vector<std::string>& candidates) {
  const std::string last = last_component(path);
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    size_t d = edit_distance(path, c);
    if (c.find('.') != std::string::npos || path.find('.') != std::string::npos) {
      // A right name in the wrong section ("lr" for "optim.lr") costs one edit.
      size_t d2 = edit_distance(last, last_component(c)) + 1;
      d = std::min(d, d2);
    }
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  if (best.empty() || best_d > suggestion_limit(last)) return "";
  return best;
}

// Shortest decimal text that reads back as exactly `v`.
std::string format_double(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  // "1e-08" -> "1e-8", "1e+20" -> "1e+20" stays readable either way; drop exponent zeros.
  auto e = s.find('e');
  if (e != std::string::npos) {
    size_t i = e + 1;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    size_t j = i;
    while (j + 1 < s.size() && s[j] == '0') ++j;
    s.erase(i, j - i);
  }
  return s;
}

std::optional<int64_t> parse_int(const std::string& text) {
  if (text.empty()) return std::nullopt;
  size_t i = (text[0] == '-' || text[0] == '+') ? 1 : 0;
  if (i >= text.size()) return std::nullopt;
  for (size_t j = i; j < text.size(); ++j)
    if (text[j] < '0' || text[j] > '9') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0') return std::nullopt;
  return static_cast<int64_t>(v);
}

std::optional<double> parse_double(const std::string& text) {
  static const std::set<std::string> inf = {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"};
  static const std::set<std::string> ninf = {"-.inf", "-.Inf", "-.INF"};
  static const std::set<std::string> nan = {".nan", ".NaN", ".NAN"};
  if (inf.count(text)) return std::numeric_limits<double>::infinity();
  if (ninf.count(text)) return -std::numeric_limits<double>::infinity();
  if (nan.count(text)) return std::numeric_limits<double>::quiet_NaN();
  if (text.empty()) return std::nullopt;
  bool digit = false;
  for (char c : text) {
    if (c >= '0' && c <= '9')
      digit = true;
    else if (!std::strchr("+-.eE", c))
      return std::nullopt;
  }
  if (!digit) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  if (errno == ERANGE && std::isinf(v)) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(const std::string& text) {
  static const std::set<std::string> t = {"true", "True", "TRUE", "yes", "Yes",
                                          "YES",  "on",   "On",   "ON"};
  static const std::set<std::string> f = {"false", "False", "FALSE", "no", "No",
                                          "NO",    "off",   "Off",   "OFF"};
  if (t.count(text)) return true;
  if (f.count(text)) return false;
  return std::nullopt;
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return "null";
    case YAML::NodeType::Scalar:
      return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
  }
  return "?";
}

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  if constexpr (std::is_same_v<T, int64_t>) return "an integer";
  if constexpr (std::is_same_v<T, double>) return "a number";
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "a list of integers";
  if constexpr (std::is_same_v<T, std::vector<double>>) return "a list of numbers";
  return "a value";
}

// Parses one scalar into T; returns false when it does not fit.
template <class T>
bool parse_scalar(const YAML::Node& n, T& out) {
  if (!n.IsScalar()) return false;
  const std::string& text = n.Scalar();
  if constexpr (std::is_same_v<T, std::string>) {
    out = text;
    return true;
  } else if constexpr (std::is_same_v<T, bool>) {
    auto v = parse_bool(text);
    if (v) out = *v;
    return v.has_value();
  } else if constexpr (std::is_same_v<T, int64_t>) {
    auto v = parse_int(text);
    if (v) out = *v;
    return v.has_value();
  } else if constexpr (std::is_same_v<T, double>) {
    auto v = parse_double(text);
    if (v) out = *v;
    return v.has_value();
  } else {
    static_assert(sizeof(T) == 0, "unsupported config leaf type");
  }
}

// ------------------------------------------------------------------------------------------------
// Key paths

struct PathCollector {
  std::string prefix;
  std::vector<std::string>* leaves;
  std::vector<std::string>* all;  // sections too; may be null

  template <class T>
  void operator()(const char* name, T& field) {
    std::string path = prefix + name;
    if (all) all->push_back(path);
    if constexpr (is_section_v<T>) {
      PathCollector sub{path + ".", leaves, all};
      field.visit(sub);
    } else {
      leaves->push_back(path);
    }
  }
};

const std::vector<std::string>& all_paths() {
  static const std::vector<std::string> paths = [] {
    std::vector<std::string> leaves, all;
    Config c;
    PathCollector pc{"", &leaves, &all};
    c.visit(pc);
    return all;
  }();
  return paths;
}

std::vector<std::string> sibling_names(const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& p : all_paths()) {
    if (p.compare(0, prefix.size(), prefix) == 0 && p.find('.', prefix.size()) == std::string::npos)
      out.push_back(p.substr(prefix.size()));
  }
  return out;
}

std::string unknown_key_message(const std::string& path) {
  std::string msg = "unknown key";
  std::string s = closest(path, all_paths());
  if (!s.empty()) msg += "; did you mean " + s + "?";
  return msg;
}

// ------------------------------------------------------------------------------------------------
// Applying YAML to the structs

struct Ctx {
  std::string file;  // display name of the file being applied
  bool fixed = false;
  Location fixed_loc;  // used for everything when `fixed` (a --set override)
  std::vector<Issue>* issues;
  std::map<std::string, Location>* origins;

  Location at(const YAML::Mark& m) const {
    if (fixed) return fixed_loc;
    if (m.is_null() || m.line < 0) return Location{file, 0, 0};
    return Location{file, m.line + 1, m.column + 1};
  }
  void issue(const YAML::Mark& m, const std::string& key, const std::string& msg) const {
    issues->push_back(Issue{at(m), key, msg});
  }
};

template <class S>
void apply_section(S& s, const YAML::Node& map, const std::string& prefix, const Ctx& ctx,
                   bool top);

template <class T>
void apply_value(T& field, const YAML::Node& node, const YAML::Mark& mark, const std::string& path,
                 const Ctx& ctx) {
  if constexpr (is_section_v<T>) {
    if (node.IsNull()) return;  // a section with everything commented out
    if (!node.IsMap()) {
      std::vector<std::string> names = sibling_names(path + ".");
      std::string example = names.empty() ? "" : " (e.g. " + path + "." + names.front() + ")";
      ctx.issue(
          mark, path,
          "is a section; expected a mapping of its keys" + example + ", got " + describe(node));
      return;
    }
    apply_section(field, node, path + ".", ctx, false);
  } else if constexpr (is_vector<T>::value) {
    using E = typename T::value_type;
    if (!node.IsSequence()) {
      std::string got = describe(node);
      std::string hint = node.IsScalar() ? "; write it as [" + node.Scalar() + "]" : "";
      ctx.issue(mark, path, std::string("expected ") + type_name<T>() + ", got " + got + hint);
      return;
    }
    T out;
    bool ok = true;
    for (size_t i = 0; i < node.size(); ++i) {
      E e{};
      YAML::Node item = node[i];
      if (!parse_scalar(item, e)) {
        ctx.issue(item.Mark().is_null() ? mark : item.Mark(), path,
                  std::string("expected ") + type_name<T>() + ", got " + describe(item) +
                      " at item " + std::to_string(i + 1));
        ok = false;
        continue;
      }
      out.push_back(e);
    }
    if (!ok) return;
    field = std::move(out);
    (*ctx.origins)[path] = ctx.at(mark);
  } else {
    T v{};
    if (!parse_scalar(node, v)) {
      std::string msg = std::string("expected ") + type_name<T>() + ", got " + describe(node);
      if constexpr (std::is_same_v<T, int64_t>) {
        if (node.IsScalar()) {
          const std::string& t = node.Scalar();
          bool digits = t.find_first_not_of("+-0123456789") == std::string::npos;
          if (digits && t.find_first_of("0123456789") != std::string::npos)
            msg += " (out of range for a 64-bit integer)";
          else if (parse_double(t))
            msg += " (not a whole number)";
        }
      }
      ctx.issue(mark, path, msg);
      return;
    }
    field = v;
    (*ctx.origins)[path] = ctx.at(mark);
  }
}

struct FieldApplier {
  const std::string& target;
  const YAML::Node& node;
  const YAML::Mark& mark;
  const std::string& path;
  const Ctx& ctx;
  bool found = false;

  template <class T>
  void operator()(const char* name, T& field) {
    if (found || target != name) return;
    found = true;
    apply_value(field, node, mark, path, ctx);
  }
};

template <class S>
void apply_section(S& s, const YAML::Node& map, const std::string& prefix, const Ctx& ctx,
                   bool top) {
  for (const auto& kv : map) {
    const YAML::Node key = kv.first;
    const YAML::Node value = kv.second;
    if (!key.IsScalar()) {
      ctx.issue(key.Mark(), prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1),
                "keys must be plain names, got " + describe(key));
      continue;
    }
    const std::string k = key.Scalar();
    if (top && k == "base") continue;
    const std::string path = prefix + k;
    const YAML::Mark mark = key.Mark();
    FieldApplier fa{k, value, mark, path, ctx};
    s.visit(fa);
    if (!fa.found) ctx.issue(key.Mark(), path, unknown_key_message(path));
  }
}

// Sets the field at parts[idx..] of `s`; false when no such key.
template <class S>
bool set_path(S& s, const std::vector<std::string>& parts, size_t idx, const YAML::Node& node,
              const std::string& path, const Ctx& ctx) {
  bool found = false;
  auto visitor = [&](const char* name, auto& field) {
    using T = std::decay_t<decltype(field)>;
    if (found || parts[idx] != name) return;
    if (idx + 1 == parts.size()) {
      found = true;
      apply_value(field, node, YAML::Mark::null_mark(), path, ctx);
    } else if constexpr (is_section_v<T>) {
      found = set_path(field, parts, idx + 1, node, path, ctx);
    }
  };
  s.visit(visitor);
  return found;
}

// ------------------------------------------------------------------------------------------------
// Reading files

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

// Checks every mapping for keys given twice.
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

struct Loader {
  std::vector<Issue> issues;
  std::map<std::string, Location> origins;
  Config cfg;

  // `display` is how the file is named in messages; `stack` the canonical chain so far (with
  // display names alongside).
  void load_file(const std::string& display, std::vector<std::pair<fs::path, std::string>>& stack) {
    Ctx ctx{display, false, {}, &issues, &origins};
    auto file_issue = [&](const std::string& msg) {
      Issue is;
      is.where.file = display;
      is.message = msg;
      issues.push_back(std::move(is));
    };
    std::error_code ec;
    fs::path p(display);
    auto st = fs::status(p, ec);
    if (ec || !fs::exists(st)) {
      file_issue("cannot read the config file: no such file");
      return;
    }
    if (fs::is_directory(st)) {
      file_issue("is a directory, not a config file");
      return;
    }
    std::ifstream in(p, std::ios::binary);
    if (!in) {
      file_issue(std::string("cannot read the config file: ") + std::strerror(errno));
      return;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) {
      file_issue("cannot read the config file");
      return;
    }
    std::string text = ss.str();
    if (text.size() >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);

    size_t bad = first_binary_byte(text);
    if (bad != std::string::npos) {
      int line, col;
      line_col(text, bad, line, col);
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(text[bad]));
      issues.push_back(Issue{{display, line, col},
                             "",
                             std::string("not a text YAML file (byte ") + hex +
                                 " is not UTF-8 text); expected a mapping of config keys"});
      return;
    }
    if (is_blank_yaml(text)) {
      file_issue("the file is empty; expected a mapping of config keys");
      return;
    }
    auto [tab_line, tab_col] = first_tab_indent(text);
    if (tab_line > 0) {
      issues.push_back(Issue{
          {display, tab_line, tab_col}, "", "tabs are not allowed for indentation; use spaces"});
      return;
    }

    YAML::Node root;
    try {
      std::vector<YAML::Node> docs = YAML::LoadAll(text);
      if (docs.empty()) {
        file_issue("the file is empty; expected a mapping of config keys");
        return;
      }
      if (docs.size() > 1) {
        file_issue("holds " + std::to_string(docs.size()) +
                   " YAML documents ('---'); expected a single mapping of config keys");
        return;
      }
      root = docs.front();
    } catch (const YAML::Exception& e) {
      Location loc{display, 0, 0};
      if (!e.mark.is_null() && e.mark.line >= 0)
        loc = {display, e.mark.line + 1, e.mark.column + 1};
      issues.push_back(Issue{loc, "", parse_error_message(e.msg)});
      return;
    } catch (const std::exception& e) {
      file_issue(std::string("invalid YAML: ") + e.what());
      return;
    }

    if (root.IsNull()) {
      file_issue("the file is empty; expected a mapping of config keys");
      return;
    }
    if (!root.IsMap()) {
      issues.push_back(
          Issue{ctx.at(root.Mark()), "",
                "expected a mapping of config keys at the top level, got " + describe(root)});
      return;
    }
    find_duplicates(root, "", ctx);

    // The base chain first.
    for (const auto& kv : root) {
      const YAML::Node key = kv.first;
      if (!key.IsScalar() || key.Scalar() != "base") continue;
      const YAML::Mark km = key.Mark();
      const YAML::Node v = kv.second;
      if (!v.IsScalar() || v.Scalar().empty()) {
        ctx.issue(km, "base", "expected a file path, got " + describe(v));
        break;
      }
      fs::path base(v.Scalar());
      std::string base_display =
          base.is_absolute() ? base.string() : (p.parent_path() / base).lexically_normal().string();
      std::error_code ec2;
      if (!fs::exists(base_display, ec2)) {
        ctx.issue(km, "base", "base file '" + base_display + "' not found");
        break;
      }
      fs::path canon = fs::weakly_canonical(base_display, ec2);
      if (ec2) canon = fs::absolute(base_display);
      auto cyc =
          std::find_if(stack.begin(), stack.end(), [&](const auto& e) { return e.first == canon; });
      if (cyc != stack.end()) {
        std::string chain;
        for (const auto& e : stack) chain += e.second + " -> ";
        chain += base_display;
        ctx.issue(km, "base", "base cycle: " + chain);
        break;
      }
      stack.emplace_back(canon, base_display);
      load_file(base_display, stack);
      stack.pop_back();
      break;  // duplicates were reported above
    }

    apply_section(cfg, root, "", ctx, true);
  }

  void apply_override(const std::string& arg) {
    Location loc{"--set " + arg, 0, 0};
    Ctx ctx{loc.file, true, loc, &issues, &origins};
    auto eq = arg.find('=');
    if (eq == std::string::npos) {
      issues.push_back(Issue{loc, "", "expected KEY.PATH=VALUE, e.g. --set optim.lr=0.01"});
      return;
    }
    std::string key = arg.substr(0, eq);
    std::string value = arg.substr(eq + 1);
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.front()))) key.erase(0, 1);
    if (key.empty()) {
      issues.push_back(
          Issue{loc, "", "empty key; expected KEY.PATH=VALUE, e.g. --set optim.lr=0.01"});
      return;
    }
    std::vector<std::string> parts;
    {
      std::string cur;
      for (char c : key) {
        if (c == '.') {
          parts.push_back(cur);
          cur.clear();
        } else {
          cur += c;
        }
      }
      parts.push_back(cur);
    }
    for (const auto& part : parts) {
      if (part.empty()) {
        issues.push_back(Issue{loc, key, "malformed key path; expected e.g. optim.lr"});
        return;
      }
    }
    YAML::Node node;
    if (value.empty()) {
      node = YAML::Node(std::string());  // `--set model.pretrained=` clears a string
    } else {
      try {
        node = YAML::Load(value);
      } catch (const YAML::Exception& e) {
        issues.push_back(Issue{loc, key, "cannot parse the value as YAML: " + e.msg});
        return;
      }
    }
    Ctx c2 = ctx;
    Config& target = cfg;
    if (!set_path(target, parts, 0, node, key, c2)) {
      issues.push_back(Issue{loc, key, unknown_key_message(key)});
    }
  }
};

// ------------------------------------------------------------------------------------------------
// Emitting YAML

bool is_plain_safe(const std::string& s) {
  if (s.empty()) return false;
  static const std::set<std::string> reserved = {
      "null",  "Null", "NULL", "~",   "true", "True", "TRUE", "false", "False",
      "FALSE", "yes",  "Yes",  "YES", "no",   "No",   "NO",   "on",    "On",
      "ON",    "off",  "Off",  "OFF", "y",    "Y",    "n",    "N"};
  if (reserved.count(s)) return false;
  if (parse_int(s) || parse_double(s)) return false;
  unsigned char first = static_cast<unsigned char>(s[0]);
  if (!(std::isalnum(first) || first == '_' || first == '/' || first == '.')) return false;
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (!(std::isalnum(c) || std::strchr("_./:+@-", c))) return false;
  }
  if (s.back() == ':') return false;
  return true;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02X", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

std::string format_leaf(bool v) {
  return v ? "true" : "false";
}
std::string format_leaf(int64_t v) {
  return std::to_string(v);
}
std::string format_leaf(double v) {
  return format_double(v);
}
std::string format_leaf(const std::string& v) {
  return is_plain_safe(v) ? v : quote(v);
}
template <class E>
std::string format_leaf(const std::vector<E>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += format_leaf(v[i]);
  }
  return s + "]";
}

struct Emitter {
  std::ostringstream& os;
  std::string indent;

  template <class T>
  void operator()(const char* name, T& field) {
    if constexpr (is_section_v<T>) {
      os << indent << name << ":\n";
      Emitter sub{os, indent + "  "};
      field.visit(sub);
    } else {
      os << indent << name << ": " << format_leaf(field) << "\n";
    }
  }
};

// ------------------------------------------------------------------------------------------------
// Reading leaves back for validation

struct StringGetter {
  const std::string& target;
  std::string prefix;
  std::optional<std::string>* out;

  template <class T>
  void operator()(const char* name, T& field) {
    std::string path = prefix + name;
    if constexpr (is_section_v<T>) {
      if (target.compare(0, path.size() + 1, path + ".") == 0) {
        StringGetter sub{target, path + ".", out};
        field.visit(sub);
      }
    } else if (path == target) {
      if constexpr (std::is_same_v<T, std::string>)
        *out = field;
      else
        *out = format_leaf(field);
    }
  }
};

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += sep;
    s += v[i];
  }
  return s;
}

std::string fmt(double v) {
  return format_double(v);
}
std::string fmt(int64_t v) {
  return std::to_string(v);
}

// "cuda:N" -> N; nullopt when not of that form.
std::optional<int64_t> cuda_index(const std::string& device) {
  if (device.rfind("cuda:", 0) != 0) return std::nullopt;
  std::string n = device.substr(5);
  if (n.empty() || n[0] == '+' || n[0] == '-') return std::nullopt;
  return parse_int(n);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Public API

LoadedConfig load(const std::string& path, const std::vector<std::string>& overrides) {
  Loader loader;
  std::vector<std::pair<fs::path, std::string>> stack;
  std::error_code ec;
  fs::path canon = fs::weakly_canonical(path, ec);
  if (ec) canon = fs::absolute(path, ec);
  stack.emplace_back(canon, path);
  loader.load_file(path, stack);
  for (const auto& o : overrides) loader.apply_override(o);
  if (!loader.issues.empty()) throw ConfigError(std::move(loader.issues));

  LoadedConfig out;
  out.cfg = std::move(loader.cfg);
  out.source = path;
  out.origins = std::move(loader.origins);
  if (out.cfg.run.dir.empty()) out.cfg.run.dir = "runs/" + fs::path(path).stem().string();
  return out;
}

std::vector<std::string> key_paths() {
  std::vector<std::string> leaves;
  Config c;
  PathCollector pc{"", &leaves, nullptr};
  c.visit(pc);
  return leaves;
}

std::vector<std::pair<std::string, std::string>> flatten(const Config& cfg) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& key : key_paths()) {
    std::optional<std::string> value;
    Config copy = cfg;
    StringGetter g{key, "", &value};
    copy.visit(g);
    out.emplace_back(key, value.value_or(""));
  }
  return out;
}

std::string to_yaml(const Config& cfg) {
  Config c = cfg;
  std::ostringstream os;
  Emitter e{os, ""};
  c.visit(e);
  return os.str();
}

std::optional<int64_t> checkpoint_period(const std::string& spec) {
  if (spec == "none") return 0;
  if (spec == "blocks") return 1;
  if (spec.rfind("every:", 0) != 0 || spec.size() == 6 || spec[6] == '+' || spec[6] == '-')
    return std::nullopt;
  auto n = parse_int(spec.substr(6));
  if (!n || *n < 1) return std::nullopt;
  return *n;
}

std::vector<Issue> validate(const LoadedConfig& loaded, const Environment& env) {
  const Config& c = loaded.cfg;
  std::vector<Issue> out;
  auto add = [&](const std::string& key, const std::string& msg) {
    out.push_back(Issue{loaded.where(key), key, msg});
  };
  auto ge = [&](const std::string& key, int64_t v, int64_t min) {
    if (v < min) add(key, "must be >= " + fmt(min) + ", got " + fmt(v));
  };
  auto ge_d = [&](const std::string& key, double v, double min) {
    if (!(v >= min)) add(key, "must be >= " + fmt(min) + ", got " + fmt(v));
  };
  auto gt_d = [&](const std::string& key, double v, double min) {
    if (!(v > min)) add(key, "must be > " + fmt(min) + ", got " + fmt(v));
  };
  auto in01 = [&](const std::string& key, double v) {  // [0, 1)
    if (!(v >= 0.0 && v < 1.0)) add(key, "must be in [0, 1), got " + fmt(v));
  };
  auto one_of = [&](const std::string& key, const std::string& v,
                    const std::vector<std::string>& allowed) {
    if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return;
    std::string msg = "must be one of " + join(allowed, ", ") + ", got '" + v + "'";
    std::string s = closest(v, allowed);
    if (!s.empty()) msg += " (did you mean " + s + "?)";
    add(key, msg);
  };

  // Top level.
  {
    const std::string& d = c.device;
    bool ok = d == "auto" || d == "cpu" || d == "cuda" || cuda_index(d).has_value();
    if (!ok) {
      add("device", "must be auto, cpu, cuda or cuda:N, got '" + d + "'");
    } else if ((d == "cuda" || cuda_index(d)) && !env.cuda_available) {
      add("device", "no CUDA device is available; use device: cpu or auto (got '" + d + "')");
    } else if (auto n = cuda_index(d); n && *n >= env.cuda_devices) {
      add("device", "device " + d + " does not exist; " + std::to_string(env.cuda_devices) +
                        " CUDA device(s) available, use cuda:0.." +
                        std::to_string(env.cuda_devices - 1));
    }
  }

  // run
  ge("run.log_every", c.run.log_every, 1);
  ge("run.eval_every", c.run.eval_every, 0);
  ge("run.checkpoint_every", c.run.checkpoint_every, 0);
  ge("run.keep_last", c.run.keep_last, 1);
  if (!c.run.keep_best.empty())
    one_of("run.keep_best", c.run.keep_best, {"top1", "top5", "loss", "ppl"});
  ge("run.threads", c.run.threads, 0);
  one_of("run.progress", c.run.progress, {"auto", "always", "never"});

  // model
  ge("model.num_classes", c.model.num_classes, 0);
  for (size_t i = 0; i < c.model.hidden.size(); ++i) {
    if (c.model.hidden[i] < 1)
      add("model.hidden", "every width must be >= 1, got " + fmt(c.model.hidden[i]) + " at item " +
                              std::to_string(i + 1));
  }
  if (c.model.channels.size() != 2) {
    add("model.channels", "must have exactly 2 entries, got " +
                              std::to_string(c.model.channels.size()) + " (e.g. [32, 64])");
  } else {
    for (size_t i = 0; i < 2; ++i)
      if (c.model.channels[i] < 1)
        add("model.channels", "every entry must be >= 1, got " + fmt(c.model.channels[i]) +
                                  " at item " + std::to_string(i + 1));
  }
  if (c.model.kernel_size < 1 || c.model.kernel_size % 2 == 0)
    add("model.kernel_size", "must be odd and >= 1, got " + fmt(c.model.kernel_size));
  ge("model.fc_hidden", c.model.fc_hidden, 1);
  in01("model.dropout", c.model.dropout);
  one_of("model.activation", c.model.activation, {"relu", "gelu", "tanh"});
  ge("model.in_channels", c.model.in_channels, 0);
  one_of("model.stem", c.model.stem, {"imagenet", "cifar"});
  ge("model.n_layer", c.model.n_layer, 1);
  ge("model.n_head", c.model.n_head, 1);
  ge("model.n_embd", c.model.n_embd, 1);
  if (c.model.n_head >= 1 && c.model.n_embd % c.model.n_head != 0)
    add("model.n_embd", "must be a multiple of model.n_head (" + fmt(c.model.n_head) + "), got " +
                            fmt(c.model.n_embd));
  ge("model.block_size", c.model.block_size, 1);
  ge("model.vocab_size", c.model.vocab_size, 0);
  if (!checkpoint_period(c.model.checkpointing))
    add("model.checkpointing",
        "must be none, blocks or every:N with N >= 1, got '" + c.model.checkpointing + "'");

  // data
  ge("data.batch_size", c.data.batch_size, 1);
  ge("data.eval_batch_size", c.data.eval_batch_size, 0);
  ge("data.workers", c.data.workers, 0);
  ge("data.prefetch", c.data.prefetch, 1);
  if (c.data.shape.empty() || c.data.shape.size() > 3) {
    add("data.shape",
        "must have 1 to 3 entries (C, H, W) or (D), got " + std::to_string(c.data.shape.size()));
  } else {
    for (size_t i = 0; i < c.data.shape.size(); ++i)
      if (c.data.shape[i] < 1)
        add("data.shape", "every entry must be >= 1, got " + fmt(c.data.shape[i]) + " at item " +
                              std::to_string(i + 1));
  }
  ge("data.num_classes", c.data.num_classes, 2);
  ge("data.train_samples", c.data.train_samples, 1);
  ge("data.val_samples", c.data.val_samples, 1);
  ge_d("data.noise", c.data.noise, 0.0);
  one_of("data.on_error", c.data.on_error, {"skip", "fail"});
  if (!c.data.mean.empty() && c.data.mean.size() != 1 && c.data.mean.size() != 3)
    add("data.mean",
        "must have 1 or 3 entries (one per channel), got " + std::to_string(c.data.mean.size()));
  if (c.data.stdev.size() != c.data.mean.size())
    add("data.std", "must have as many entries as data.mean (" +
                        std::to_string(c.data.mean.size()) + "), got " +
                        std::to_string(c.data.stdev.size()));
  for (size_t i = 0; i < c.data.stdev.size(); ++i)
    if (!(c.data.stdev[i] > 0.0))
      add("data.std", "every entry must be > 0, got " + fmt(c.data.stdev[i]) + " at item " +
                          std::to_string(i + 1));
  ge("data.crop_padding", c.data.crop_padding, 0);
  if (!(c.data.hflip >= 0.0 && c.data.hflip <= 1.0))
    add("data.hflip", "must be a probability in [0, 1], got " + fmt(c.data.hflip));
  ge("data.image_size", c.data.image_size, 1);
  ge("data.resize_size", c.data.resize_size, 1);
  if (c.data.resize_size >= 1 && c.data.image_size > c.data.resize_size)
    add("data.resize_size", "must be >= data.image_size (" + fmt(c.data.image_size) + "), got " +
                                fmt(c.data.resize_size));
  auto range = [&](const std::string& key, const std::vector<double>& r, double lo, double hi) {
    if (r.size() != 2 || !(r[0] > lo && r[0] <= r[1] && r[1] <= hi))
      add(key, "must be two numbers [low, high] with " + fmt(lo) + " < low <= high <= " + fmt(hi));
  };
  range("data.crop_scale", c.data.crop_scale, 0.0, 1.0);
  range("data.crop_ratio", c.data.crop_ratio, 0.0, 100.0);
  one_of("data.token_format", c.data.token_format, {"auto", "uint16", "bytes"});
  ge("data.seq_len", c.data.seq_len, 0);
  if (!(c.data.val_fraction > 0.0 && c.data.val_fraction < 1.0))
    add("data.val_fraction", "must be in (0, 1), got " + fmt(c.data.val_fraction));

  // train
  if (c.train.max_steps <= 0 && c.train.epochs < 1)
    add("train.epochs", "must be >= 1 (or set train.max_steps > 0), got " + fmt(c.train.epochs));
  ge("train.max_steps", c.train.max_steps, 0);
  ge("train.stop_at_step", c.train.stop_at_step, 0);
  if (!(c.train.stop_at_top1 >= 0.0 && c.train.stop_at_top1 <= 1.0))
    add("train.stop_at_top1",
        "must be a fraction in [0, 1] (0 = off), got " + fmt(c.train.stop_at_top1));
  ge("train.grad_accum_steps", c.train.grad_accum_steps, 1);
  ge_d("train.clip_grad_norm", c.train.clip_grad_norm, 0.0);
  ge("train.max_bad_steps", c.train.max_bad_steps, 0);
  in01("train.label_smoothing", c.train.label_smoothing);

  // optim
  gt_d("optim.lr", c.optim.lr, 0.0);
  in01("optim.momentum", c.optim.momentum);
  ge_d("optim.weight_decay", c.optim.weight_decay, 0.0);
  if (c.optim.betas.size() != 2) {
    add("optim.betas", "must have exactly 2 entries, got " + std::to_string(c.optim.betas.size()) +
                           " (e.g. [0.9, 0.999])");
  } else {
    for (size_t i = 0; i < 2; ++i)
      if (!(c.optim.betas[i] >= 0.0 && c.optim.betas[i] < 1.0))
        add("optim.betas", "every entry must be in [0, 1), got " + fmt(c.optim.betas[i]) +
                               " at item " + std::to_string(i + 1));
  }
  gt_d("optim.eps", c.optim.eps, 0.0);
  if (c.optim.nesterov && !(c.optim.momentum > 0.0))
    add("optim.nesterov", "Nesterov momentum needs optim.momentum > 0, got momentum " +
                              fmt(c.optim.momentum) + "; set a momentum or nesterov: false");

  // sched
  ge("sched.warmup_steps", c.sched.warmup_steps, 0);
  ge_d("sched.warmup_epochs", c.sched.warmup_epochs, 0.0);
  if (c.sched.warmup_epochs > 0.0 && c.sched.warmup_steps > 0)
    add("sched.warmup_epochs", "set either sched.warmup_steps or sched.warmup_epochs, not both");
  if (!(c.sched.warmup_start_factor >= 0.0 && c.sched.warmup_start_factor <= 1.0))
    add("sched.warmup_start_factor", "must be in [0, 1], got " + fmt(c.sched.warmup_start_factor));
  ge("sched.step_size", c.sched.step_size, 1);
  for (size_t i = 0; i < c.sched.milestones.size(); ++i) {
    int64_t m = c.sched.milestones[i];
    if (m < 1) {
      add("sched.milestones",
          "every milestone must be >= 1, got " + fmt(m) + " at item " + std::to_string(i + 1));
    } else if (i > 0 && m <= c.sched.milestones[i - 1]) {
      add("sched.milestones", "must be strictly increasing, got " + fmt(m) + " after " +
                                  fmt(c.sched.milestones[i - 1]) + " at item " +
                                  std::to_string(i + 1));
    }
  }
  if (!(c.sched.gamma > 0.0 && c.sched.gamma <= 1.0))
    add("sched.gamma", "must be in (0, 1], got " + fmt(c.sched.gamma));
  ge_d("sched.min_lr", c.sched.min_lr, 0.0);
  if ((c.sched.name == "cosine" || c.sched.name == "linear") && c.sched.min_lr >= 0.0 &&
      !(c.sched.min_lr < c.optim.lr))
    add("sched.min_lr", "must be < optim.lr (" + fmt(c.optim.lr) + ") for the " + c.sched.name +
                            " schedule, got " + fmt(c.sched.min_lr));

  // amp
  one_of("amp.dtype", c.amp.dtype, {"float16", "bfloat16"});
  if (c.amp.enabled && c.amp.dtype == "float16" &&
      (c.device == "cpu" || (c.device == "auto" && !env.cuda_available)))
    add("amp.dtype",
        "float16 autocast needs a CUDA device; use amp.dtype: bfloat16 or a cuda device");
  one_of("amp.scaler", c.amp.scaler, {"auto", "on", "off"});
  gt_d("amp.init_scale", c.amp.init_scale, 0.0);
  if (!(c.amp.growth_factor > 1.0))
    add("amp.growth_factor", "must be > 1, got " + fmt(c.amp.growth_factor));
  if (!(c.amp.backoff_factor > 0.0 && c.amp.backoff_factor < 1.0))
    add("amp.backoff_factor", "must be in (0, 1), got " + fmt(c.amp.backoff_factor));
  ge("amp.growth_interval", c.amp.growth_interval, 1);

  // dist
  one_of("dist.backend", c.dist.backend, {"auto", "nccl", "gloo"});
  gt_d("dist.bucket_cap_mb", c.dist.bucket_cap_mb, 0.0);
  gt_d("dist.first_bucket_mb", c.dist.first_bucket_mb, 0.0);
  gt_d("dist.init_timeout_s", c.dist.init_timeout_s, 0.0);
  gt_d("dist.timeout_s", c.dist.timeout_s, 0.0);
  if (c.dist.backend == "nccl" && (!env.cuda_available || c.device == "cpu"))
    add("dist.backend", "nccl needs CUDA devices; use dist.backend: gloo or auto");

  // Registry names.
  for (const auto& [key, names] : env.choices) {
    std::optional<std::string> value;
    Config copy = c;
    StringGetter g{key, "", &value};
    copy.visit(g);
    if (!value) continue;
    if (std::find(names.begin(), names.end(), *value) != names.end()) continue;
    std::string msg = "unknown " + key + " '" + *value + "'; registered: " + join(names, ", ");
    std::string s = closest(*value, names);
    if (!s.empty()) msg += " (did you mean " + s + "?)";
    add(key, msg);
  }
  return out;
}

void check(const LoadedConfig& loaded, const Environment& env) {
  auto issues = validate(loaded, env);
  if (!issues.empty()) throw ConfigError(std::move(issues));
}

}  // namespace trainer::config
