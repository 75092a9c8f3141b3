// Loading the run configuration (see loader.h): a config file over the defaults, the files of its
// `base:` chain under it, and the `--set` overrides over both.

#include "config/loader.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "config/loader_internal.h"
#include "util/net/url.h"

namespace trainer::config {

namespace fs = std::filesystem;

// ------------------------------------------------------------------------------------------------
// LoadedConfig

Location LoadedConfig::where(const std::string& key) const {
  auto it = origins.find(key);
  if (it != origins.end()) return it->second;
  return Location{source, 0, 0};
}

namespace detail {

std::vector<Issue> without_repeats(std::vector<Issue> issues) {
  std::vector<Issue> out;
  std::set<std::string> seen;
  for (auto& issue : issues) {
    if (seen.insert(issue.str()).second) out.push_back(std::move(issue));
  }
  return out;
}

Environment any_machine() {
  Environment env;
  env.cuda_available = true;
  env.cuda_devices = std::numeric_limits<int64_t>::max();
  return env;
}

namespace {

using FileStack = std::vector<std::pair<fs::path, std::string>>;  // canonical path, display name

struct Loader {
  explicit Loader(const Config& defaults) : cfg(defaults), paths(all_paths(defaults)) {}

  std::vector<Issue> issues;
  std::map<std::string, Location> origins;
  Config cfg;
  const std::vector<std::string> paths;  // every key path, for suggestions

  // Loads the file named by the `base:` key of `root`, if any, before `root` applies over it.
  void load_base(const YAML::Node& root, const fs::path& p, FileStack& stack, const Ctx& ctx) {
    for (const auto& kv : root) {
      const YAML::Node key = kv.first;
      if (!key.IsScalar() || key.Scalar() != "base") continue;
      const YAML::Mark km = key.Mark();
      const YAML::Node v = kv.second;
      if (!v.IsScalar() || v.Scalar().empty()) {
        return ctx.issue(km, "base", "expected a file path, got " + describe(v));
      }
      const fs::path base(v.Scalar());
      const std::string base_display =
          base.is_absolute() ? base.string() : (p.parent_path() / base).lexically_normal().string();
      std::error_code ec;
      if (!fs::exists(base_display, ec)) {
        return ctx.issue(km, "base", "base file '" + base_display + "' not found");
      }
      fs::path canon = fs::weakly_canonical(base_display, ec);
      if (ec) canon = fs::absolute(base_display);
      const auto cyc =
          std::find_if(stack.begin(), stack.end(), [&](const auto& e) { return e.first == canon; });
      if (cyc != stack.end()) {
        std::string chain;
        for (const auto& e : stack) chain += e.second + " -> ";
        return ctx.issue(km, "base", "base cycle: " + chain + base_display);
      }
      stack.emplace_back(canon, base_display);
      load_file(base_display, stack);
      stack.pop_back();
      return;  // a second `base:` was reported as a duplicate key
    }
  }

  // `display` is how the file is named in messages; `stack` the canonical chain so far (with
  // display names alongside).
  void load_file(const std::string& display, FileStack& stack) {
    const Ctx ctx{display, false, {}, &issues, &origins, &paths};
    const auto text = read_text(display, issues);
    if (!text || !check_text(display, *text, issues)) return;
    const auto root = parse_root(display, *text, ctx);
    if (!root) return;
    find_duplicates(*root, "", ctx);
    load_base(*root, fs::path(display), stack, ctx);
    apply_file(cfg, *root, ctx);
  }

  // The parts of a --set key path; empty after reporting a malformed one.
  std::vector<std::string> key_parts(const std::string& key, const Location& loc) {
    std::vector<std::string> parts(1);
    for (char c : key) {
      if (c == '.') {
        parts.emplace_back();
      } else {
        parts.back() += c;
      }
    }
    for (const auto& part : parts) {
      if (part.empty()) {
        issues.push_back(Issue{loc, key, "malformed key path; expected e.g. optim.lr"});
        return {};
      }
    }
    return parts;
  }

  void apply_override(const std::string& arg) {
    const Location loc{"--set " + mask_url_credentials(arg), 0, 0};  // shown: no secret
    const Ctx ctx{loc.file, true, loc, &issues, &origins, &paths};
    const auto eq = arg.find('=');
    if (eq == std::string::npos) {
      issues.push_back(Issue{loc, "", "expected KEY.PATH=VALUE, e.g. --set optim.lr=0.01"});
      return;
    }
    std::string key = arg.substr(0, eq);
    const std::string value = arg.substr(eq + 1);
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.front()))) key.erase(0, 1);
    if (key.empty()) {
      issues.push_back(
          Issue{loc, "", "empty key; expected KEY.PATH=VALUE, e.g. --set optim.lr=0.01"});
      return;
    }
    const auto parts = key_parts(key, loc);
    if (parts.empty()) return;
    YAML::Node node = YAML::Node(std::string());  // `--set model.pretrained=` clears a string
    if (!value.empty()) {
      try {
        node = YAML::Load(value);
      } catch (const YAML::Exception& e) {
        issues.push_back(Issue{loc, key, "cannot parse the value as YAML: " + e.msg});
        return;
      }
    }
    if (!set_path(cfg, parts, node, key, ctx))
      issues.push_back(Issue{loc, key, unknown_key_message(key, paths)});
  }
};

}  // namespace
}  // namespace detail

// ------------------------------------------------------------------------------------------------
// Public API

LoadedConfig load(const std::string& path, const std::vector<std::string>& overrides,
                  const Config& defaults) {
  detail::Loader loader(defaults);
  detail::FileStack stack;
  std::error_code ec;
  fs::path canon = fs::weakly_canonical(path, ec);
  if (ec) canon = fs::absolute(path, ec);
  stack.emplace_back(canon, path);
  loader.load_file(path, stack);
  for (const auto& o : overrides) loader.apply_override(o);

  LoadedConfig out;
  out.cfg = std::move(loader.cfg);
  out.source = path;
  out.origins = std::move(loader.origins);
  if (out.cfg.run.dir.empty()) out.cfg.run.dir = "runs/" + fs::path(path).stem().string();
  if (!loader.issues.empty()) {
    // The values that loaded are checked too, so that one report holds every problem; the checks
    // about the machine and registered names come with check(), once the file loads.
    for (auto& issue : validate(out, detail::any_machine())) loader.issues.push_back(issue);
    throw ConfigError(detail::without_repeats(std::move(loader.issues)));
  }
  return out;
}

}  // namespace trainer::config
