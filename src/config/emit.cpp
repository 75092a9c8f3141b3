// Printing the configuration: to_yaml() writes every key as YAML that loads back to an equal
// Config (a URL's credentials masked); flatten() and lookup() give each leaf as (key path, value)
// text.

#include <cctype>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config/loader.h"
#include "config/loader_internal.h"
#include "util/format.h"
#include "util/net/url.h"

namespace trainer::config {
namespace detail {
namespace {

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
std::string format_leaf(const std::string& text) {
  const std::string v = mask_url_credentials(text);  // nothing printed or stored holds a secret
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
  const std::string* entry = nullptr;  // an item of a section list: the entry it names

  template <class T>
  void operator()(const char* name, T& field) {
    if constexpr (is_entries_v<T>) {
      if (entry) {
        visit_entry(field, *entry, *this);
      } else {
        visit_flat(field, *this);
      }
    } else if constexpr (is_section_v<T>) {
      os << indent << name << ":\n";
      Emitter sub{os, indent + "  "};
      field.visit(sub);
    } else if constexpr (is_section_list_v<T>) {
      if (field.items.empty()) {
        os << indent << name << ": []\n";
        return;
      }
      os << indent << name << ":\n";
      for (auto& item : field.items) {  // "- " before the item's first key
        std::ostringstream text;
        Emitter sub{text, indent + "    ", &item.name};
        item.visit(sub);
        os << indent << "  - " << text.str().substr(indent.size() + 4);
      }
    } else {
      os << indent << name << ": " << format_leaf(field) << "\n";
    }
  }
};

// Each leaf of a section list's item as "key: value" (YAML flow), the entry it names alone.
struct FlowItem {
  std::string* out;
  const std::string* entry;

  template <class T>
  void operator()(const char* name, T& field) {
    if constexpr (is_entries_v<T>) {
      visit_entry(field, *entry, *this);
    } else if constexpr (!is_section_v<T> && !is_section_list_v<T>) {
      *out += std::string(out->empty() ? "" : ", ") + name + ": " + format_leaf(field);
    }
  }
};

// A section list as one line of YAML: [{name: a, weight: 1}, ...].
template <class S>
std::string flow_list(SectionList<S>& list) {
  std::string text;
  for (auto& item : list.items) {
    std::string fields;
    FlowItem flow{&fields, &item.name};
    item.visit(flow);
    text += std::string(text.empty() ? "" : ", ") + "{" + fields + "}";
  }
  return "[" + text + "]";
}

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
    } else if constexpr (is_section_list_v<T>) {
      out->emplace_back(prefix + name, flow_list(field));
    } else if constexpr (std::is_same_v<T, std::string>) {
      out->emplace_back(prefix + name, mask_url_credentials(field));
    } else {
      out->emplace_back(prefix + name, format_leaf(field));
    }
  }
};

}  // namespace
}  // namespace detail

std::vector<std::pair<std::string, std::string>> flatten(const Config& cfg) {
  std::vector<std::pair<std::string, std::string>> out;
  Config c = cfg;
  detail::Flattener f{"", &out};
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
  detail::Emitter e{os, ""};
  c.visit(e);
  return os.str();
}

}  // namespace trainer::config
