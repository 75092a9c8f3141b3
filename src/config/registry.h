// A name -> factory table, one per extensible kind (models, datasets, optimizers, ...), keyed by
// the YAML `name`, with each entry's own config keys (config/options.h). Built once at start-up
// and read-only afterwards. Torch-free.
#pragma once

#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "config/options.h"

namespace trainer {

// Thrown by Registry::get for a name nobody registered.
class UnknownName : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

template <class Factory>
class Registry {
 public:
  // `kind` names the registered things in messages, e.g. "model".
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  // Registers `factory` under `name`, with the defaults of the entry's own config keys when it
  // has any (config::options_of<Struct>()); a name can be registered once.
  void add(const std::string& name, Factory factory,
           std::unique_ptr<config::Options> options = nullptr) {
    if (!entries_.emplace(name, std::move(factory)).second) {
      throw std::logic_error(kind_ + " '" + name + "' is registered twice");
    }
    if (options) options_.add(name, std::move(options));
  }

  bool contains(const std::string& name) const { return entries_.count(name) != 0; }

  // The factory for `name`; throws UnknownName listing the registered names.
  const Factory& get(const std::string& name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      std::string known;
      for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
      throw UnknownName("unknown " + kind_ + " '" + name + "'; registered: " + known);
    }
    return it->second;
  }

  // Registered names, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, factory] : entries_) out.push_back(name);
    return out;
  }

  // The defaults of every entry's own config keys, for its config section's `options`.
  const config::Entries& options() const { return options_; }

 private:
  std::string kind_;
  std::map<std::string, Factory> entries_;
  config::Entries options_;
};

// A registry of `kind` filled by calling each of `adders`, the register_<file> functions of the
// built-in entries, once. Each registry.cpp lists its built-in files in an X-macro:
//
//   #define TRAINER_BUILTIN_MODELS(X) X(mlp) X(lenet) ... /* one line per file */
//   TRAINER_BUILTIN_MODELS(TRAINER_DECLARE_REGISTER_FN)  // with the registry type in scope as R
//   make_registry<ModelRegistry>("model", {TRAINER_BUILTIN_MODELS(TRAINER_REGISTER_FN)});
template <class R>
R make_registry(const std::string& kind, std::initializer_list<void (*)(R&)> adders) {
  R registry(kind);
  for (auto add : adders) add(registry);
  return registry;
}

}  // namespace trainer

// X-macro helpers for make_registry: declares `void register_<name>(R&)`, and names it in a list.
#define TRAINER_DECLARE_REGISTER_FN(name) void register_##name(R& registry);
#define TRAINER_REGISTER_FN(name) register_##name,
