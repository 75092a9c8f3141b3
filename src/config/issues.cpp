#include "config/issues.h"

#include <algorithm>
#include <cmath>

#include "util/format.h"
#include "util/strings.h"

namespace trainer::config {
namespace {

std::string join_issues(const std::vector<Issue>& issues) {
  std::vector<std::string> lines;
  for (const auto& issue : issues) lines.push_back(issue.str());
  return join(lines, "\n");
}

}  // namespace

std::string Location::str() const {
  if (line <= 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

std::string Issue::str() const {
  std::string s = where.str() + ": ";
  if (!key.empty()) s += key + ": ";
  return s + message;
}

ConfigError::ConfigError(std::vector<Issue> issues)
    : std::runtime_error(join_issues(issues)), issues_(std::move(issues)) {}

Checks::Checks(std::string prefix, Where where, std::vector<Issue>& out)
    : prefix_(std::move(prefix)), where_(std::move(where)), out_(&out) {}

Checks Checks::section(const std::string& prefix) const {
  return Checks(prefix_ + prefix, where_, *out_);
}

void Checks::add(const std::string& key, const std::string& message) {
  const std::string path = prefix_ + key;
  out_->push_back(Issue{where_(path), path, message});
}

void Checks::at_least(const std::string& key, int64_t v, int64_t min) {
  if (v < min) add(key, "must be >= " + std::to_string(min) + ", got " + std::to_string(v));
}

void Checks::at_least(const std::string& key, double v, double min) {
  if (std::isinf(v)) {
    add(key, "must be a finite number, got " + format_number(v));
  } else if (!(v >= min)) {
    add(key, "must be >= " + format_number(min) + ", got " + format_number(v));
  }
}

void Checks::above(const std::string& key, double v, double min) {
  if (std::isinf(v)) {
    add(key, "must be a finite number, got " + format_number(v));
  } else if (!(v > min)) {
    add(key, "must be > " + format_number(min) + ", got " + format_number(v));
  }
}

void Checks::fraction(const std::string& key, double v) {
  if (!(v >= 0.0 && v < 1.0)) add(key, "must be in [0, 1), got " + format_number(v));
}

void Checks::one_of(const std::string& key, const std::string& v,
                    const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return;
  std::string msg = "must be one of " + join(allowed, ", ") + ", got '" + v + "'";
  const std::string s = closest(v, allowed);
  if (!s.empty()) msg += " (did you mean " + s + "?)";
  add(key, msg);
}

void Checks::each_at_least(const std::string& key, const std::vector<int64_t>& v, int64_t min,
                           const std::string& what) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < min) {
      add(key, what + " must be >= " + std::to_string(min) + ", got " + std::to_string(v[i]) +
                   " at item " + std::to_string(i + 1));
    }
  }
}

}  // namespace trainer::config
