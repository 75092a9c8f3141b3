#include "config/options.h"

namespace trainer::config {

Entries::Entries(const Entries& other) {
  *this = other;
}

Entries& Entries::operator=(const Entries& other) {
  if (this == &other) return *this;
  entries_.clear();
  for (const auto& [name, options] : other.entries_) entries_.emplace_back(name, options->clone());
  return *this;
}

void Entries::add(const std::string& name, std::unique_ptr<Options> options) {
  if (find(name)) throw std::logic_error("the options of '" + name + "' are added twice");
  entries_.emplace_back(name, std::move(options));
}

Options* Entries::find(const std::string& name) const {
  for (const auto& [entry, options] : entries_) {
    if (entry == name) return options.get();
  }
  return nullptr;
}

}  // namespace trainer::config
