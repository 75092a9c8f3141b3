// Configuration problems: where a value came from, what is wrong with it, and the checks that find
// range and consistency problems. Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::config {

// Where a value came from: a YAML file position, or a command-line override.
struct Location {
  std::string file;  // file path as given, or e.g. "--set optim.lr=0.1"
  int line = 0;      // 1-based; 0 = no position (a command-line value or a whole file)
  int column = 0;    // 1-based; 0 = no position

  // "file:line:column", "file" when there is no position.
  std::string str() const;
};

// One problem with the configuration.
struct Issue {
  Location where;
  std::string key;      // full key path, e.g. "optim.lr"; empty for file-level problems
  std::string message;  // what is wrong and how to fix it

  // "<where>: <key>: <message>" (the key part is left out when empty).
  std::string str() const;
};

// Thrown when the configuration cannot be used; what() holds every issue, one per line.
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(std::vector<Issue> issues);
  const std::vector<Issue>& issues() const { return issues_; }

 private:
  std::vector<Issue> issues_;
};

// Range checks of one config section. Keys are given relative to the section ("lr" in "optim.")
// and reported under their full path, at the place the value was set.
class Checks {
 public:
  using Where = std::function<Location(const std::string& key)>;

  // Reports into `out`; `where` locates a full key path.
  Checks(std::string prefix, Where where, std::vector<Issue>& out);

  // The checks of a sub-section, e.g. section("model.") at the top level.
  Checks section(const std::string& prefix) const;
  const std::string& prefix() const { return prefix_; }

  // "<prefix><key>: <message>" at the key's location.
  void add(const std::string& key, const std::string& message);
  // "must be >= min, got v"
  void at_least(const std::string& key, int64_t v, int64_t min);
  void at_least(const std::string& key, double v, double min);
  // "must be > min, got v"
  void above(const std::string& key, double v, double min);
  // "must be in [0, 1), got v"
  void fraction(const std::string& key, double v);
  // "must be one of a, b, got 'v'", with a suggestion for a near miss.
  void one_of(const std::string& key, const std::string& v,
              const std::vector<std::string>& allowed);
  // "<what> must be >= min, got v at item i" for each entry below `min`.
  void each_at_least(const std::string& key, const std::vector<int64_t>& v, int64_t min,
                     const std::string& what = "every entry");

 private:
  std::string prefix_;
  Where where_;
  std::vector<Issue>* out_;
};

}  // namespace trainer::config
