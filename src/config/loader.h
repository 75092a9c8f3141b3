// Loading, merging, validating and printing the run configuration.
//
// Precedence: `--set` overrides > the YAML file (deep-merged over its `base:` chain) > the
// defaults in config.h. Every problem is reported with where it came from
// (file:line:column, or the `--set` argument), all of them together.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"

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

// A merged configuration and where each leaf value was last set from.
struct LoadedConfig {
  Config cfg;
  std::string source;                       // the top-level config file path as given
  std::map<std::string, Location> origins;  // key path -> where it was set; defaults absent

  // Where `key` was set, or a Location naming the top-level file when it kept its default.
  Location where(const std::string& key) const;
};

// Reads `path` (following `base:`), applies the `KEY.PATH=VALUE` overrides in order and fills
// in run.dir when it was left empty. Throws ConfigError listing every problem found.
// Does not run validate().
LoadedConfig load(const std::string& path, const std::vector<std::string>& overrides);

// Facts about the machine that some checks depend on, supplied by the caller.
struct Environment {
  bool cuda_available = false;  // whether a CUDA device can be used
  int64_t cuda_devices = 0;     // number of CUDA devices
  // Registered names for registry-keyed fields: key path ("model.name", "data.name",
  // "optim.name", "sched.name", "train.loss") -> names. Keys absent here are not checked.
  std::map<std::string, std::vector<std::string>> choices;
};

// Range and consistency checks on a merged configuration. Returns every problem found.
std::vector<Issue> validate(const LoadedConfig& loaded, const Environment& env);

// Throws ConfigError when validate() finds anything.
void check(const LoadedConfig& loaded, const Environment& env);

// The full configuration as YAML: every key, in declaration order. Loading it back gives an
// equal Config.
std::string to_yaml(const Config& cfg);

// Every valid leaf key path ("seed", "optim.lr", ...), in declaration order.
std::vector<std::string> key_paths();

// The `model.checkpointing` setting as a block period: 0 for none, 1 for blocks (every block), N
// for every:N (every N-th block); nullopt when the setting is malformed.
std::optional<int64_t> checkpoint_period(const std::string& spec);

// Every leaf as (key path, value as to_yaml writes it), in declaration order.
std::vector<std::pair<std::string, std::string>> flatten(const Config& cfg);

}  // namespace trainer::config
