// The checks of tracking.mlflow: what MLflow's server would refuse (its REST API's limits, in
// mlflow/utils/validation.py) is a config error at start rather than a run the server rejects.
#include <cctype>
#include <cstring>
#include <set>

#include "config/config.h"
#include "util/net/url.h"
#include "util/strings.h"

namespace trainer::config {
namespace {

constexpr size_t kExperimentNameMax = 500;  // MAX_EXPERIMENT_NAME_LENGTH
constexpr size_t kTagKeyMax = 250;          // MAX_ENTITY_KEY_LENGTH
constexpr size_t kTagValueMax = 8000;       // MAX_TAG_VAL_LENGTH

// What is wrong with the address of a server; "" when nothing.
std::string uri_problem(const std::string& uri) {
  if (uri.rfind("http://", 0) != 0 && uri.rfind("https://", 0) != 0) {
    return "must be the http:// or https:// address of an MLflow tracking server (start one with "
           "`mlflow server --host 127.0.0.1 --port 5000`)";
  }
  if (has_unencoded_user_info(uri)) {
    return "its user-info holds a '/', '?' or '#' before the '@', which would end the host "
           "part; percent-encode them in the password (%2F, %3F, %23)";
  }
  const auto parts = parse_url(uri);
  if (!parts || parts->host.empty() || parts->host == "[]") {
    return "names no host; e.g. http://127.0.0.1:5000";
  }
  if (!parts->port.empty()) {
    const bool digits =
        parts->port.size() <= 5 && parts->port.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stol(parts->port) < 1 || std::stol(parts->port) > 65535) {
      return "port '" + parts->port + "' is not a TCP port (1 to 65535)";
    }
  }
  return "";
}

// What MLflow's server says of a tag key (_validate_tag_name); "" when it takes it.
std::string tag_key_problem(const std::string& key) {
  for (char ch : key) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x80 && !std::isalnum(c) && !std::strchr("_-. /:", c)) {
      return "may only hold letters, digits and _ - . / : and spaces (MLflow's rule)";
    }
  }
  if (key.size() > kTagKeyMax) return "is longer than MLflow's 250 characters";
  // Names must not resolve to other names as paths (posixpath.normpath(name) == name).
  if (key.front() == '/' || key.back() == '/' || key == "." || key.rfind("..", 0) == 0 ||
      key.find("//") != std::string::npos || key.find("/./") != std::string::npos ||
      key.find("/../") != std::string::npos || key.rfind("./", 0) == 0 ||
      (key.size() >= 2 && key.compare(key.size() - 2, 2, "/.") == 0) ||
      (key.size() >= 3 && key.compare(key.size() - 3, 3, "/..") == 0)) {
    return "is not a plain path (MLflow refuses names that resolve to another name as a path)";
  }
  if (key.rfind("mlflow.", 0) == 0 || key.rfind("trainer.", 0) == 0) {
    return "is reserved: mlflow.* and trainer.* tags are set by the trainer (mlflow.runName is "
           "tracking.mlflow.run_name)";
  }
  return "";
}

void check_tags(const MlflowConfig& m, Checks& c) {
  std::optional<std::string> malformed;
  const auto tags = m.tag_list(&malformed);
  if (malformed) {
    c.add("tags",
          "expected key=value pairs separated by commas (e.g. team=vision,owner=ana), got '" +
              *malformed + "'");
  }
  std::set<std::string> seen;
  for (const auto& [key, value] : tags) {
    const std::string problem = tag_key_problem(key);
    if (!problem.empty()) c.add("tags", "tag '" + key + "' " + problem + "; rename it");
    if (!seen.insert(key).second) {
      c.add("tags", "tag '" + key + "' is given twice; MLflow keeps one value per tag: keep one");
    }
    if (value.size() > kTagValueMax) {
      c.add("tags", "the value of tag '" + key + "' is longer than MLflow's 8000 characters");
    }
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> MlflowConfig::tag_list(
    std::optional<std::string>* malformed) const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& item : split(tags, ',')) {
    const auto eq = item.find('=');
    const std::string key = eq == std::string::npos ? "" : trim(item.substr(0, eq));
    if (key.empty()) {
      if (malformed && !*malformed) *malformed = item;
      continue;
    }
    out.emplace_back(key, trim(item.substr(eq + 1)));
  }
  return out;
}

void MlflowConfig::validate(Checks& c) const {
  if (!uri.empty()) {
    const std::string problem = uri_problem(uri);
    if (!problem.empty()) c.add("uri", problem + ", got '" + mask_url_credentials(uri) + "'");
  }
  if (!uri.empty() && experiment.empty()) c.add("experiment", "must name an experiment");
  if (experiment.size() > kExperimentNameMax) {
    c.add("experiment",
          "is " + std::to_string(experiment.size()) + " characters long; MLflow takes at most 500");
  }
  check_tags(*this, c);
}

}  // namespace trainer::config
