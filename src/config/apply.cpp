// Applying YAML values to the config structs: parsing scalars into typed fields, listing key paths,
// and the "did you mean" suggestions for unknown keys.

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config/loader.h"
#include "config/loader_internal.h"
#include "util/strings.h"

namespace trainer::config {
namespace detail {

// ------------------------------------------------------------------------------------------------
// Scalars

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

namespace {

std::optional<bool> parse_bool(const std::string& text) {
  static const std::set<std::string> t = {"true", "True", "TRUE", "yes", "Yes",
                                          "YES",  "on",   "On",   "ON"};
  static const std::set<std::string> f = {"false", "False", "FALSE", "no", "No",
                                          "NO",    "off",   "Off",   "OFF"};
  if (t.count(text)) return true;
  if (f.count(text)) return false;
  return std::nullopt;
}

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  if constexpr (std::is_same_v<T, int64_t>) return "an integer";
  if constexpr (std::is_same_v<T, double>) return "a number";
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "a list of integers";
  if constexpr (std::is_same_v<T, std::vector<double>>) return "a list of numbers";
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return "a list of names";
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

}  // namespace

// ------------------------------------------------------------------------------------------------
// Key paths

namespace {

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
    if constexpr (is_section_v<T>) {  // a section list is one leaf: its items have no fixed paths
      PathCollector sub{path + ".", leaves, all};
      field.visit(sub);
    } else {
      leaves->push_back(path);
    }
  }
};

std::vector<std::string> sibling_names(const std::string& prefix,
                                       const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    if (p.compare(0, prefix.size(), prefix) == 0 && p.find('.', prefix.size()) == std::string::npos)
      out.push_back(p.substr(prefix.size()));
  }
  return out;
}

}  // namespace

std::vector<std::string> all_paths(const Config& cfg) {
  std::vector<std::string> leaves, all;
  Config c = cfg;
  PathCollector pc{"", &leaves, &all};
  c.visit(pc);
  return all;
}

std::string unknown_key_message(const std::string& path, const std::vector<std::string>& paths) {
  std::string msg = "unknown key";
  std::string s = closest(path, paths);
  if (!s.empty()) msg += "; did you mean " + s + "?";
  return msg;
}

// ------------------------------------------------------------------------------------------------
// Applying YAML to the structs

namespace {

template <class S>
void apply_section(S& s, const YAML::Node& map, const std::string& prefix, const Ctx& ctx,
                   bool top);

// A sequence of mappings, each applied to a copy of the list's prototype; the list replaces the
// field's items whole (a base file's list too).
template <class S>
void apply_list(SectionList<S>& field, const YAML::Node& node, const YAML::Mark& mark,
                const std::string& path, const Ctx& ctx) {
  if (node.IsNull()) return;
  if (!node.IsSequence()) {
    ctx.issue(mark, path,
              "expected a list of mappings (- name: ...), one per item, got " + describe(node));
    return;
  }
  std::vector<S> items;
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node item = node[i];
    if (!item.IsMap()) {
      ctx.issue(item.Mark().is_null() ? mark : item.Mark(), path,
                "expected a mapping of keys (name: ...) at item " + std::to_string(i + 1) +
                    ", got " + describe(item));
      continue;
    }
    items.push_back(field.prototype);
    apply_section(items.back(), item, item_prefix(path, i), ctx, false);
  }
  field.items = std::move(items);
  (*ctx.origins)[path] = ctx.at(mark);
}

// Whether `node` at `path` is model.lora.targets given as PEFT's shorthand alone (all-linear, in
// any case, as PEFT compares it; nn/lora.h resolves it): a string, as PEFT's target_modules takes
// it, or a one-entry list.
bool all_linear_shorthand(const std::string& path, const YAML::Node& node) {
  if (path != "model.lora.targets") return false;
  const YAML::Node one = node.IsSequence() && node.size() == 1 ? node[0] : node;
  if (!one.IsScalar()) return false;
  std::string text = one.Scalar();
  for (auto& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return text == "all-linear";
}

// A list value (a std::vector of scalars): every item parsed, or issues naming the items that
// are not of the type.
template <class T>
void apply_vector(T& field, const YAML::Node& node, const YAML::Mark& mark, const std::string& path,
                  const Ctx& ctx) {
  using E = typename T::value_type;
  if constexpr (std::is_same_v<E, std::string>) {
    if (all_linear_shorthand(path, node)) {
      field = {"all-linear"};  // stored as a one-entry list
      (*ctx.origins)[path] = ctx.at(mark);
      return;
    }
  }
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
}

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
  } else if constexpr (is_section_list_v<T>) {
    apply_list(field, node, mark, path, ctx);
  } else if constexpr (is_vector<T>::value) {
    apply_vector(field, node, mark, path, ctx);
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

}  // namespace

void apply_file(Config& cfg, const YAML::Node& root, const Ctx& ctx) {
  apply_section(cfg, root, "", ctx, true);
}

bool set_path(Config& cfg, const std::vector<std::string>& parts, const YAML::Node& node,
              const std::string& path, const Ctx& ctx) {
  PathSetter setter{parts, 0, node, path, ctx};
  cfg.visit(setter);
  return setter.found;
}

}  // namespace detail

std::vector<std::string> key_paths(const Config& cfg) {
  std::vector<std::string> leaves;
  Config c = cfg;
  detail::PathCollector pc{"", &leaves, nullptr};
  c.visit(pc);
  return leaves;
}

}  // namespace trainer::config
