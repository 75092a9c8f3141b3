// Internal to config/: the helpers that the loader's files (loader.cpp, yaml_text.cpp, apply.cpp,
// emit.cpp, validate.cpp) share. Not part of the config/ interface; include only from config/.
//
// Everything generic walks the structs' `visit` methods, so a new field in config.h, or a new
// registered entry with its own keys, needs no change here: FieldApplier (apply.cpp) applies YAML
// to a field, Emitter (emit.cpp) prints it, PathCollector (apply.cpp) lists keys. A section's
// `Entries` (every registered entry's own keys) reads to these visitors as more fields of the
// section, each key once (Flat).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "config/config.h"
#include "config/issues.h"
#include "config/loader.h"

namespace trainer::config::detail {

// ------------------------------------------------------------------------------------------------
// Type traits and visiting entries

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

template <class T>
constexpr bool is_entries_v = std::is_same_v<T, Entries>;

template <class T>
struct is_section_list : std::false_type {};
template <class S>
struct is_section_list<SectionList<S>> : std::true_type {};
template <class T>
constexpr bool is_section_list_v = is_section_list<T>::value;

template <class T>
constexpr bool is_section_v = std::is_class_v<T> && !std::is_same_v<T, std::string> &&
                              !is_vector<T>::value && !is_entries_v<T> && !is_section_list_v<T>;

// The key prefix of item `i` of the section list at `path`: "data.mix[0].".
inline std::string item_prefix(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "].";
}

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

// The fields of entry `name` alone (an item of a section list writes only the keys of the entry
// it names); nothing when it has none.
template <class V>
void visit_entry(Entries& entries, const std::string& name, V& v) {
  Forward<V> forward(v);
  if (Options* options = entries.find(name)) options->visit(forward);
}

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

// ------------------------------------------------------------------------------------------------
// Where applied values come from and where their problems go

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

// ------------------------------------------------------------------------------------------------
// loader.cpp

// Identical issues once each, in order: a value with a problem that several entries share is
// reported by each of them.
std::vector<Issue> without_repeats(std::vector<Issue> issues);

// A machine on which every device setting is possible and no registered name is checked: the
// checks of validate() under it find only the problems that are problems on any machine.
Environment any_machine();

// ------------------------------------------------------------------------------------------------
// apply.cpp: scalars, key paths and applying YAML to the structs

// `text` as a decimal integer, or as a number (YAML's .inf and .nan too); nullopt when it is not
// one or is out of range.
std::optional<int64_t> parse_int(const std::string& text);
std::optional<double> parse_double(const std::string& text);

// How a node reads in messages: 'text', null, a list or a mapping.
std::string describe(const YAML::Node& n);

// Every key path of `cfg`, sections included.
std::vector<std::string> all_paths(const Config& cfg);

// "unknown key", with the closest of `paths` to `path` when one is near enough.
std::string unknown_key_message(const std::string& path, const std::vector<std::string>& paths);

// Applies a file's top-level mapping `root` to `cfg`, skipping its `base:` key.
void apply_file(Config& cfg, const YAML::Node& root, const Ctx& ctx);

// Sets the field at `parts` (a --set key path, `path` joined) to `node`; false when no field has
// that path.
bool set_path(Config& cfg, const std::vector<std::string>& parts, const YAML::Node& node,
              const std::string& path, const Ctx& ctx);

// ------------------------------------------------------------------------------------------------
// yaml_text.cpp: reading and checking YAML text

// The text of config file `display`, or nullopt after reporting why it cannot be used.
std::optional<std::string> read_text(const std::string& display, std::vector<Issue>& issues);

// Problems that stop YAML from reading `text` sensibly: binary bytes, no content, tabs.
bool check_text(const std::string& display, const std::string& text, std::vector<Issue>& issues);

// The single top-level mapping of `text`, or nullopt after reporting why there is none.
std::optional<YAML::Node> parse_root(const std::string& display, const std::string& text,
                                     const Ctx& ctx);

// Checks every mapping for keys given twice.
void find_duplicates(const YAML::Node& n, const std::string& prefix, const Ctx& ctx);

}  // namespace trainer::config::detail
