// The keys that belong to one registered entry of an extensible kind: a model's own keys
// (model.hidden for mlp, model.n_layer for gpt), a data set's, an optimizer's.
//
// An entry declares them in its own file as a plain struct with a default and a comment per field,
// `template <class V> void visit(V& v)` listing the fields, and `void validate(Checks&) const`. Its
// registry (config/registry.h) holds the defaults. The loader reads and writes those keys under
// the kind's section (`model:`) as if they were the section's own: a key set in YAML or with
// --set goes to every entry that declares it (entries may share a key, as mlp, lenet and gpt
// share model.dropout), every entry is validated, and config.yaml lists each key once. The
// selected entry reads its own struct (ModelConfig::own<T>()). Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config/issues.h"

namespace trainer::config {

// Reads or writes each leaf field of an entry's options by name: one overload per leaf type.
class FieldVisitor {
 public:
  virtual ~FieldVisitor() = default;
  virtual void operator()(const char* name, bool& field) = 0;
  virtual void operator()(const char* name, int64_t& field) = 0;
  virtual void operator()(const char* name, double& field) = 0;
  virtual void operator()(const char* name, std::string& field) = 0;
  virtual void operator()(const char* name, std::vector<int64_t>& field) = 0;
  virtual void operator()(const char* name, std::vector<double>& field) = 0;
};

// One entry's options, whatever their struct.
class Options {
 public:
  virtual ~Options() = default;
  virtual std::unique_ptr<Options> clone() const = 0;
  virtual void visit(FieldVisitor& visitor) = 0;
  // Adds a problem to `checks` (keys relative to the section) for each value out of range.
  virtual void validate(Checks& checks) const = 0;
};

// Options held as the entry's own struct T.
template <class T>
class OptionsOf final : public Options {
 public:
  explicit OptionsOf(T value = T{}) : value(std::move(value)) {}
  std::unique_ptr<Options> clone() const override { return std::make_unique<OptionsOf>(value); }
  void visit(FieldVisitor& visitor) override { value.visit(visitor); }
  void validate(Checks& checks) const override { value.validate(checks); }

  T value;
};

// The defaults of options struct T, for a registry entry.
template <class T>
std::unique_ptr<Options> options_of() {
  return std::make_unique<OptionsOf<T>>();
}

// The options of every registered entry of one kind, each under its registry name.
class Entries {
 public:
  Entries() = default;
  Entries(const Entries& other);
  Entries& operator=(const Entries& other);
  Entries(Entries&&) noexcept = default;
  Entries& operator=(Entries&&) noexcept = default;

  // Adds entry `name` with `options`; an entry is added once.
  void add(const std::string& name, std::unique_ptr<Options> options);
  // The options of entry `name`, or null when it has none here.
  Options* find(const std::string& name) const;
  // Every entry with options, in the order added.
  const std::vector<std::pair<std::string, std::unique_ptr<Options>>>& all() const {
    return entries_;
  }

  // The options of entry `name` as its struct T; an entry not held here has T's defaults.
  // Throws std::logic_error when `name` holds another struct.
  template <class T>
  const T& get(const std::string& name) const {
    const Options* options = find(name);
    if (!options) {
      static const T defaults{};
      return defaults;
    }
    const auto* typed = dynamic_cast<const OptionsOf<T>*>(options);
    if (!typed) throw std::logic_error("the options of '" + name + "' are of another type");
    return typed->value;
  }

  // Sets the field `key` of every entry that declares it (what --set does for one key). Throws
  // std::out_of_range when no entry has a field `key` of the value's type.
  void set(const std::string& key, bool value) { set_typed(key, value); }
  void set(const std::string& key, int value) { set_typed(key, int64_t{value}); }
  void set(const std::string& key, int64_t value) { set_typed(key, value); }
  void set(const std::string& key, double value) { set_typed(key, value); }
  void set(const std::string& key, const char* value) { set_typed(key, std::string(value)); }
  void set(const std::string& key, const std::string& value) { set_typed(key, value); }
  void set(const std::string& key, const std::vector<int64_t>& value) { set_typed(key, value); }
  void set(const std::string& key, const std::vector<double>& value) { set_typed(key, value); }

  // The value of field `key` of the first entry that declares it with type T. Throws
  // std::out_of_range when none does.
  template <class T>
  T value(const std::string& key) const;

 private:
  template <class T>
  void set_typed(const std::string& key, const T& value);

  std::vector<std::pair<std::string, std::unique_ptr<Options>>> entries_;
};

namespace detail {

// Calls `fn(field)` for the field named `key` of type T.
template <class T, class Fn>
class TypedField final : public FieldVisitor {
 public:
  TypedField(const std::string& key, Fn fn) : key_(key), fn_(std::move(fn)) {}
  void operator()(const char* n, bool& f) override { pick(n, f); }
  void operator()(const char* n, int64_t& f) override { pick(n, f); }
  void operator()(const char* n, double& f) override { pick(n, f); }
  void operator()(const char* n, std::string& f) override { pick(n, f); }
  void operator()(const char* n, std::vector<int64_t>& f) override { pick(n, f); }
  void operator()(const char* n, std::vector<double>& f) override { pick(n, f); }
  bool found = false;

 private:
  template <class U>
  void pick(const char* name, U& field) {
    if constexpr (std::is_same_v<U, T>) {
      if (key_ == name) {
        fn_(field);
        found = true;
      }
    }
  }
  const std::string& key_;
  Fn fn_;
};

}  // namespace detail

template <class T>
void Entries::set_typed(const std::string& key, const T& value) {
  bool found = false;
  for (auto& [name, options] : entries_) {
    auto assign = [&value](T& field) { field = value; };
    detail::TypedField<T, decltype(assign)> setter(key, assign);
    options->visit(setter);
    found = found || setter.found;
  }
  if (!found) throw std::out_of_range("no entry has a key '" + key + "' of that type");
}

template <class T>
T Entries::value(const std::string& key) const {
  for (const auto& [name, options] : entries_) {
    T out{};
    auto read = [&out](T& field) { out = field; };
    detail::TypedField<T, decltype(read)> getter(key, read);
    options->visit(getter);
    if (getter.found) return out;
  }
  throw std::out_of_range("no entry has a key '" + key + "' of that type");
}

}  // namespace trainer::config
