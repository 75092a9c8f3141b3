// Loading, merging, validating and printing the run configuration (see loader.h).
//
// Everything generic walks the structs' `visit` methods, so a new field in config.h, or a new
// registered entry with its own keys, needs no change here: FieldApplier applies YAML to a field,
// Emitter prints it, PathCollector lists keys. A section's `Entries` (every registered entry's own
// keys) reads to these visitors as more fields of the section, each key once (Flat).

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

#include "util/format.h"
#include "util/strings.h"

namespace trainer::config {

namespace fs = std::filesystem;

// ------------------------------------------------------------------------------------------------
// LoadedConfig

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
constexpr bool is_entries_v = std::is_same_v<T, Entries>;

template <class T>
constexpr bool is_section_v = std::is_class_v<T> && !std::is_same_v<T, std::string> &&
                              !is_vector<T>::value && !is_entries_v<T>;

// Hands each leaf field of an entry's options to a template visitor V.
template <class V>
class Forward final : public FieldVisitor {
 public:
  explicit Forward(V& v) : v_(v) {}
  void operator()(const char* n, bool& f) override { v_(n, f); }
  void operator()(const char* n, int64_t& f) override { v_(n, f); }
  void operator()(const char* n, double& f) override { v_(n, f); }
  void operator()(const char* n, std::string& f) override { v_(n, f); }
  void operator()(const char* n, std::vector<int64_t>& f) override { v_(n, f); }
  void operator()(const char* n, std::vector<double>& f) override { v_(n, f); }

 private:
  V& v_;
};

// Every entry's fields, a key shared by several entries once (its first declaration): for
// visitors that read (listing keys, printing).
template <class V>
void visit_flat(Entries& entries, V& v) {
  std::set<std::string> seen;
  auto once = [&](const char* name, auto& field) {
    if (seen.insert(name).second) v(name, field);
  };
  Forward<decltype(once)> forward(once);
  for (const auto& [entry, options] : entries.all()) options->visit(forward);
}

// Every entry's fields, a shared key once per entry that declares it: for visitors that write.
template <class V>
void visit_all(Entries& entries, V& v) {
  Forward<V> forward(v);
  for (const auto& [entry, options] : entries.all()) options->visit(forward);
}

// Identical issues once each, in order: a value with a problem that several entries share is
// reported by each of them.
std::vector<Issue> without_repeats(std::vector<Issue> issues) {
  std::vector<Issue> out;
  std::set<std::string> seen;
  for (auto& issue : issues) {
    if (seen.insert(issue.str()).second) out.push_back(std::move(issue));
  }
  return out;
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
    if constexpr (is_entries_v<T>) {
      visit_flat(field, *this);
      return;
    }
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

// Every key path of `cfg`, sections included.
std::vector<std::string> all_paths(const Config& cfg) {
  std::vector<std::string> leaves, all;
  Config c = cfg;
  PathCollector pc{"", &leaves, &all};
  c.visit(pc);
  return all;
}

std::vector<std::string> sibling_names(const std::string& prefix,
                                       const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    if (p.compare(0, prefix.size(), prefix) == 0 && p.find('.', prefix.size()) == std::string::npos)
      out.push_back(p.substr(prefix.size()));
  }
  return out;
}

std::string unknown_key_message(const std::string& path, const std::vector<std::string>& paths) {
  std::string msg = "unknown key";
  std::string s = closest(path, paths);
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
  const std::vector<std::string>* paths;  // every key path, for suggestions

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
      std::vector<std::string> names = sibling_names(path + ".", *ctx.paths);
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

  // Applies to every field named `target`: the section's own, or each entry's that declares it.
  template <class T>
  void operator()(const char* name, T& field) {
    if constexpr (is_entries_v<T>) {
      visit_all(field, *this);
    } else if (target == name) {
      found = true;
      apply_value(field, node, mark, path, ctx);
    }
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
    if (!fa.found) ctx.issue(key.Mark(), path, unknown_key_message(path, *ctx.paths));
  }
}

// Sets the field at parts[idx..] (a --set key path) to `node`.
struct PathSetter {
  const std::vector<std::string>& parts;
  size_t idx;
  const YAML::Node& node;
  const std::string& path;
  const Ctx& ctx;
  bool found = false;  // some field has that path

  template <class T>
  void operator()(const char* name, T& field) {
    if constexpr (is_entries_v<T>) {
      visit_all(field, *this);
    } else if (parts[idx] == name) {
      if (idx + 1 == parts.size()) {
        found = true;
        apply_value(field, node, YAML::Mark::null_mark(), path, ctx);
      } else if constexpr (is_section_v<T>) {
        PathSetter sub{parts, idx + 1, node, path, ctx};
        field.visit(sub);
        found = found || sub.found;
      }
    }
  }
};

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

using FileStack = std::vector<std::pair<fs::path, std::string>>;  // canonical path, display name

struct Loader {
  explicit Loader(const Config& defaults) : cfg(defaults), paths(all_paths(defaults)) {}

  std::vector<Issue> issues;
  std::map<std::string, Location> origins;
  Config cfg;
  const std::vector<std::string> paths;  // every key path, for suggestions

  void file_issue(const std::string& display, const std::string& msg) {
    Issue issue;
    issue.where.file = display;
    issue.message = msg;
    issues.push_back(std::move(issue));
  }

  // The text of config file `display`, or nullopt after reporting why it cannot be used.
  std::optional<std::string> read_text(const std::string& display) {
    std::error_code ec;
    const fs::path p(display);
    const auto st = fs::status(p, ec);
    if (ec || !fs::exists(st))
      return file_issue(display, "cannot read the config file: no such file"), std::nullopt;
    if (fs::is_directory(st))
      return file_issue(display, "is a directory, not a config file"), std::nullopt;
    std::ifstream in(p, std::ios::binary);
    if (!in) {
      file_issue(display, std::string("cannot read the config file: ") + std::strerror(errno));
      return std::nullopt;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) return file_issue(display, "cannot read the config file"), std::nullopt;
    std::string text = ss.str();
    if (text.size() >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
    return text;
  }

  // Problems that stop YAML from reading `text` sensibly: binary bytes, no content, tabs.
  bool check_text(const std::string& display, const std::string& text) {
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
      file_issue(display, "the file is empty; expected a mapping of config keys");
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

  // The single top-level mapping of `text`, or nullopt after reporting why there is none.
  std::optional<YAML::Node> parse_root(const std::string& display, const std::string& text,
                                       const Ctx& ctx) {
    YAML::Node root;
    try {
      std::vector<YAML::Node> docs = YAML::LoadAll(text);
      if (docs.size() > 1) {
        file_issue(display,
                   "holds " + std::to_string(docs.size()) +
                       " YAML documents ('---'); expected a single mapping of config keys");
        return std::nullopt;
      }
      if (!docs.empty()) root = docs.front();
    } catch (const YAML::Exception& e) {
      Location loc{display, 0, 0};
      if (!e.mark.is_null() && e.mark.line >= 0)
        loc = {display, e.mark.line + 1, e.mark.column + 1};
      issues.push_back(Issue{loc, "", parse_error_message(e.msg)});
      return std::nullopt;
    } catch (const std::exception& e) {
      file_issue(display, std::string("invalid YAML: ") + e.what());
      return std::nullopt;
    }
    if (!root.IsDefined() || root.IsNull()) {
      file_issue(display, "the file is empty; expected a mapping of config keys");
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
      file_issue(display,
                 "expands to more than 1,000,000 YAML nodes (aliases of aliases); a config holds a "
                 "few hundred keys: write the values out");
      return std::nullopt;
    }
    return root;
  }

  // Loads the file named by the `base:` key of `root`, if any, before `root` applies over it.
  void load_base(const YAML::Node& root, const fs::path& p, FileStack& stack, const Ctx& ctx) {
    for (const auto& kv : root) {
      const YAML::Node key = kv.first;
      if (!key.IsScalar() || key.Scalar() != "base") continue;
      const YAML::Mark km = key.Mark();
      const YAML::Node v = kv.second;
      if (!v.IsScalar() || v.Scalar().empty()) {
        return ctx.issue(km, "base", "expected a file path, got " + describe(v));
      }
      const fs::path base(v.Scalar());
      const std::string base_display =
          base.is_absolute() ? base.string() : (p.parent_path() / base).lexically_normal().string();
      std::error_code ec;
      if (!fs::exists(base_display, ec)) {
        return ctx.issue(km, "base", "base file '" + base_display + "' not found");
      }
      fs::path canon = fs::weakly_canonical(base_display, ec);
      if (ec) canon = fs::absolute(base_display);
      const auto cyc =
          std::find_if(stack.begin(), stack.end(), [&](const auto& e) { return e.first == canon; });
      if (cyc != stack.end()) {
        std::string chain;
        for (const auto& e : stack) chain += e.second + " -> ";
        return ctx.issue(km, "base", "base cycle: " + chain + base_display);
      }
      stack.emplace_back(canon, base_display);
      load_file(base_display, stack);
      stack.pop_back();
      return;  // a second `base:` was reported as a duplicate key
    }
  }

  // `display` is how the file is named in messages; `stack` the canonical chain so far (with
  // display names alongside).
  void load_file(const std::string& display, FileStack& stack) {
    const Ctx ctx{display, false, {}, &issues, &origins, &paths};
    const auto text = read_text(display);
    if (!text || !check_text(display, *text)) return;
    const auto root = parse_root(display, *text, ctx);
    if (!root) return;
    find_duplicates(*root, "", ctx);
    load_base(*root, fs::path(display), stack, ctx);
    apply_section(cfg, *root, "", ctx, true);
  }

  // The parts of a --set key path; empty after reporting a malformed one.
  std::vector<std::string> key_parts(const std::string& key, const Location& loc) {
    std::vector<std::string> parts(1);
    for (char c : key) {
      if (c == '.') {
        parts.emplace_back();
      } else {
        parts.back() += c;
      }
    }
    for (const auto& part : parts) {
      if (part.empty()) {
        issues.push_back(Issue{loc, key, "malformed key path; expected e.g. optim.lr"});
        return {};
      }
    }
    return parts;
  }

  void apply_override(const std::string& arg) {
    const Location loc{"--set " + arg, 0, 0};
    const Ctx ctx{loc.file, true, loc, &issues, &origins, &paths};
    const auto eq = arg.find('=');
    if (eq == std::string::npos) {
      issues.push_back(Issue{loc, "", "expected KEY.PATH=VALUE, e.g. --set optim.lr=0.01"});
      return;
    }
    std::string key = arg.substr(0, eq);
    const std::string value = arg.substr(eq + 1);
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.front()))) key.erase(0, 1);
    if (key.empty()) {
      issues.push_back(
          Issue{loc, "", "empty key; expected KEY.PATH=VALUE, e.g. --set optim.lr=0.01"});
      return;
    }
    const auto parts = key_parts(key, loc);
    if (parts.empty()) return;
    YAML::Node node = YAML::Node(std::string());  // `--set model.pretrained=` clears a string
    if (!value.empty()) {
      try {
        node = YAML::Load(value);
      } catch (const YAML::Exception& e) {
        issues.push_back(Issue{loc, key, "cannot parse the value as YAML: " + e.msg});
        return;
      }
    }
    PathSetter setter{parts, 0, node, key, ctx};
    cfg.visit(setter);
    if (!setter.found) issues.push_back(Issue{loc, key, unknown_key_message(key, paths)});
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
  return format_number(v);
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
    if constexpr (is_entries_v<T>) {
      visit_flat(field, *this);
    } else if constexpr (is_section_v<T>) {
      os << indent << name << ":\n";
      Emitter sub{os, indent + "  "};
      field.visit(sub);
    } else {
      os << indent << name << ": " << format_leaf(field) << "\n";
    }
  }
};

// Every leaf as (key path, value), strings as they are and the rest as to_yaml writes them.
struct Flattener {
  std::string prefix;
  std::vector<std::pair<std::string, std::string>>* out;

  template <class T>
  void operator()(const char* name, T& field) {
    if constexpr (is_entries_v<T>) {
      visit_flat(field, *this);
    } else if constexpr (is_section_v<T>) {
      Flattener sub{prefix + name + ".", out};
      field.visit(sub);
    } else if constexpr (std::is_same_v<T, std::string>) {
      out->emplace_back(prefix + name, field);
    } else {
      out->emplace_back(prefix + name, format_leaf(field));
    }
  }
};

// Runs each section's validate() and each of its entries' under the section's key prefix.
struct SectionChecker {
  Checks checks;

  template <class T>
  void operator()(const char* name, T& field) {
    if constexpr (is_entries_v<T>) {
      for (const auto& [entry, options] : field.all()) options->validate(checks);
    } else if constexpr (is_section_v<T>) {
      Checks own = checks.section(std::string(name) + ".");
      field.validate(own);
      SectionChecker inner{own};
      field.visit(inner);
    }
  }
};

// "cuda:N" -> N; nullopt when not of that form.
std::optional<int64_t> cuda_index(const std::string& device) {
  if (device.rfind("cuda:", 0) != 0) return std::nullopt;
  std::string n = device.substr(5);
  if (n.empty() || n[0] == '+' || n[0] == '-') return std::nullopt;
  return parse_int(n);
}

// The checks about the machine and across sections.
void check_environment(const Config& c, const Environment& env, Checks& checks) {
  const std::string& d = c.device;
  const bool known = d == "auto" || d == "cpu" || d == "cuda" || cuda_index(d).has_value();
  if (!known) {
    checks.add("device", "must be auto, cpu, cuda or cuda:N, got '" + d + "'");
  } else if ((d == "cuda" || cuda_index(d)) && !env.cuda_available) {
    checks.add("device", "no CUDA device is available; use device: cpu or auto (got '" + d + "')");
  } else if (auto n = cuda_index(d); n && *n >= env.cuda_devices) {
    checks.add("device", "device " + d + " does not exist; " + std::to_string(env.cuda_devices) +
                             " CUDA device(s) available, use cuda:0.." +
                             std::to_string(env.cuda_devices - 1));
  }
  const bool cpu_only = c.device == "cpu" || (c.device == "auto" && !env.cuda_available);
  if (c.amp.enabled && c.amp.dtype == "float16" && cpu_only) {
    checks.add("amp.dtype",
               "float16 autocast needs a CUDA device; use amp.dtype: bfloat16 or a cuda device");
  }
  if (c.dist.backend == "nccl" && (!env.cuda_available || c.device == "cpu")) {
    checks.add("dist.backend", "nccl needs CUDA devices; use dist.backend: gloo or auto");
  }
  if ((c.sched.name == "cosine" || c.sched.name == "linear") && c.sched.min_lr >= 0.0 &&
      !(c.sched.min_lr < c.optim.lr)) {
    checks.add("sched.min_lr", "must be < optim.lr (" + format_number(c.optim.lr) + ") for the " +
                                   c.sched.name + " schedule, got " +
                                   format_number(c.sched.min_lr));
  }
}

// train.cuda_graph: what a captured step cannot do.
void check_cuda_graph(const Config& c, const Environment& env, Checks& checks) {
  if (!c.train.cuda_graph) return;
  const auto fail = [&](const std::string& why) { checks.add("train.cuda_graph", why); };
  if (c.device == "cpu" || (c.device == "auto" && !env.cuda_available)) {
    fail("needs a CUDA device (device: cuda); set train.cuda_graph: false");
  }
  if (c.optim.impl == "foreach" || c.optim.impl == "loop") {
    fail(
        "needs optim.impl fused (a captured step reads the learning rate and the skip decision "
        "on the device; " +
        c.optim.impl + " computes them on the host)");
  }
  if (c.model.checkpointing != "none") {
    fail(
        "cannot capture model.checkpointing (its recomputation sets the RNG state from the host); "
        "set model.checkpointing: none");
  }
  if (!c.data.drop_last) {
    fail("needs batches of one shape; set data.drop_last: true");
  }
  if (c.dist.strategy == "fsdp") {
    fail(
        "cannot capture fsdp's gathers and frees; set dist.strategy: ddp or train.cuda_graph: "
        "false");
  }
  if (c.dist.find_unused_parameters || c.dist.reducer_at_world_size_1) {
    fail(
        "cannot capture DDP's reducer; set dist.find_unused_parameters and "
        "dist.reducer_at_world_size_1 to false");
  }
}

// Registry-keyed values ("model.name", ...) that name nothing registered.
void check_names(const Config& c, const Environment& env, Checks& checks) {
  for (const auto& [key, names] : env.choices) {
    const auto found = lookup(c, key);
    if (!found) continue;
    const std::string& value = *found;
    if (std::find(names.begin(), names.end(), value) != names.end()) continue;
    std::string msg = "unknown " + key + " '" + value + "'; registered: " + join(names, ", ");
    const std::string s = closest(value, names);
    if (!s.empty()) msg += " (did you mean " + s + "?)";
    checks.add(key, msg);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Public API

LoadedConfig load(const std::string& path, const std::vector<std::string>& overrides,
                  const Config& defaults) {
  Loader loader(defaults);
  FileStack stack;
  std::error_code ec;
  fs::path canon = fs::weakly_canonical(path, ec);
  if (ec) canon = fs::absolute(path, ec);
  stack.emplace_back(canon, path);
  loader.load_file(path, stack);
  for (const auto& o : overrides) loader.apply_override(o);
  if (!loader.issues.empty()) throw ConfigError(without_repeats(std::move(loader.issues)));

  LoadedConfig out;
  out.cfg = std::move(loader.cfg);
  out.source = path;
  out.origins = std::move(loader.origins);
  if (out.cfg.run.dir.empty()) out.cfg.run.dir = "runs/" + fs::path(path).stem().string();
  return out;
}

std::vector<std::string> key_paths(const Config& cfg) {
  std::vector<std::string> leaves;
  Config c = cfg;
  PathCollector pc{"", &leaves, nullptr};
  c.visit(pc);
  return leaves;
}

std::vector<std::pair<std::string, std::string>> flatten(const Config& cfg) {
  std::vector<std::pair<std::string, std::string>> out;
  Config c = cfg;
  Flattener f{"", &out};
  c.visit(f);
  return out;
}

std::optional<std::string> lookup(const Config& cfg, const std::string& key) {
  for (auto& [path, value] : flatten(cfg)) {
    if (path == key) return value;
  }
  return std::nullopt;
}

std::string to_yaml(const Config& cfg) {
  Config c = cfg;
  std::ostringstream os;
  Emitter e{os, ""};
  c.visit(e);
  return os.str();
}

std::vector<Issue> validate(const LoadedConfig& loaded, const Environment& env) {
  std::vector<Issue> issues;
  Checks top(
      "", [&](const std::string& key) { return loaded.where(key); }, issues);
  Config c = loaded.cfg;
  SectionChecker sections{top};
  c.visit(sections);
  check_environment(c, env, top);
  check_cuda_graph(c, env, top);
  check_names(c, env, top);
  return without_repeats(std::move(issues));
}

void check(const LoadedConfig& loaded, const Environment& env) {
  auto issues = validate(loaded, env);
  if (!issues.empty()) throw ConfigError(std::move(issues));
}

}  // namespace trainer::config
