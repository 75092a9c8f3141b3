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
#include "config/issues.h"

namespace trainer::config {

// A merged configuration and where each leaf value was last set from.
struct LoadedConfig {
  Config cfg;
  std::string source;                       // the top-level config file path as given
  std::map<std::string, Location> origins;  // key path -> where it was set; defaults absent

  // Where `key` was set, or a Location naming the top-level file when it kept its default.
  Location where(const std::string& key) const;
};

// Reads `path` (following `base:`) over `defaults`, applies the `KEY.PATH=VALUE` overrides in
// order and fills in run.dir when it was left empty. `defaults` holds every registered entry's
// own keys (engine::config_defaults()); a key no section or entry declares is an error. Throws
// ConfigError listing every problem found; when it finds some, the values that loaded are also
// checked by validate() (on a machine that allows every device setting) and reported in the same
// ConfigError. A file that loads is not validated here: check() does that.
LoadedConfig load(const std::string& path, const std::vector<std::string>& overrides,
                  const Config& defaults);

// Facts about the machine that some checks depend on, supplied by the caller.
struct Environment {
  bool cuda_available = false;  // whether a CUDA device can be used
  int64_t cuda_devices = 0;     // number of CUDA devices
  // Registered names for registry-keyed fields: key path ("model.name", "data.name",
  // "optim.name", "sched.name", "train.loss") -> names. Keys absent here are not checked.
  std::map<std::string, std::vector<std::string>> choices;
};

// Range and consistency checks on a merged configuration: each section's own (config.cpp), each
// registered entry's (its validate()), and those across sections or about the machine. Returns
// every problem found, each once.
std::vector<Issue> validate(const LoadedConfig& loaded, const Environment& env);

// Throws ConfigError when validate() finds anything.
void check(const LoadedConfig& loaded, const Environment& env);

// The full configuration as YAML: every key, in declaration order. Loading it back gives an
// equal Config, except that the credentials of a URL (tracking.mlflow.uri's
// http://user:password@host) are masked (util/net/url.h): what is printed or stored holds no
// secret.
std::string to_yaml(const Config& cfg);

// Every valid leaf key path of `cfg` ("seed", "optim.lr", ...), in declaration order, the entries'
// own keys after their section's, each once.
std::vector<std::string> key_paths(const Config& cfg = Config{});

// Every leaf as (key path, value): strings as they are (a URL's credentials masked, as to_yaml
// does), the rest as to_yaml writes them; in declaration order.
std::vector<std::pair<std::string, std::string>> flatten(const Config& cfg);

// The value of leaf `key` as flatten() gives it; nullopt when `cfg` has no such key.
std::optional<std::string> lookup(const Config& cfg, const std::string& key);

}  // namespace trainer::config
