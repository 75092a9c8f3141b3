#include "engine/observe/mlflow_run.h"

#include <pwd.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "config/loader.h"
#include "util/fileio.h"
#include "util/net/net.h"
#include "util/strings.h"

namespace trainer::engine {
namespace {

namespace fs = std::filesystem;

std::string first_line_of(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return trim(line);
}

// The commit checked out in the git work tree holding the working directory; "" when none.
std::string git_commit() {
  std::error_code ec;
  for (fs::path dir = fs::current_path(ec); !ec && !dir.empty(); dir = dir.parent_path()) {
    const fs::path git = dir / ".git";
    if (fs::is_directory(git, ec)) {
      const std::string head = first_line_of(git / "HEAD");
      if (head.rfind("ref: ", 0) != 0) return head;  // detached
      const std::string ref = head.substr(5);
      if (fs::exists(git / ref, ec)) return first_line_of(git / ref);
      std::ifstream packed(git / "packed-refs");
      for (std::string line; std::getline(packed, line);) {
        if (line.size() > 41 && line.compare(41, std::string::npos, ref) == 0)
          return line.substr(0, 40);
      }
      return "";
    }
    if (dir == dir.root_path()) break;
  }
  return "";
}

// The user as MLflow's client names it (Python's getpass.getuser()): the first of LOGNAME, USER,
// LNAME and USERNAME that is set, else the password database's name for the real user id.
std::string user_name() {
  for (const char* name : {"LOGNAME", "USER", "LNAME", "USERNAME"}) {
    const char* value = std::getenv(name);
    if (value && *value) return value;
  }
  const struct passwd* entry = ::getpwuid(::getuid());
  return entry && entry->pw_name ? entry->pw_name : "";
}

tracking::KeyValues system_tags(const config::Config& cfg) {
  const std::string run_dir = fs::absolute(cfg.run.dir).string();
  const std::string user = user_name();
  tracking::KeyValues tags = {{"mlflow.source.name", "trainer"},
                              {"mlflow.source.type", "LOCAL"},
                              {"mlflow.user", user},
                              {"trainer.host", host_name("")},
                              {"trainer.version", TRAINER_VERSION},
                              {"trainer.libtorch", TORCH_VERSION},
                              {"trainer.run_dir", run_dir},
                              {"trainer.config", run_dir + "/config.yaml"}};
  const std::string commit = git_commit();
  if (!commit.empty()) tags.emplace_back("mlflow.source.git.commit", commit);
  for (auto& tag : cfg.tracking.mlflow.tag_list()) tags.push_back(std::move(tag));
  return tags;
}

config::ConfigError setup_error(const config::Location& where,
                                const tracking::MlflowSetupError& e) {
  return config::ConfigError({config::Issue{where, "tracking.mlflow.uri",
                                            std::string("MLflow's environment: ") + e.what()}});
}

}  // namespace

void check_mlflow_setup(const config::LoadedConfig& loaded) {
  const std::string& uri = loaded.cfg.tracking.mlflow.uri;
  if (uri.empty()) return;
  try {
    tracking::mlflow_server(uri);
  } catch (const tracking::MlflowSetupError& e) {
    throw setup_error(loaded.where("tracking.mlflow.uri"), e);
  }
}

std::unique_ptr<tracking::MlflowTracker> start_mlflow(const config::Config& cfg, bool resumed) {
  const auto& m = cfg.tracking.mlflow;
  if (m.uri.empty()) return nullptr;
  const fs::path id_file = fs::path(cfg.run.dir) / "mlflow_run_id";
  tracking::MlflowRunSpec spec;
  spec.uri = m.uri;
  spec.experiment = m.experiment;
  spec.run_name = m.run_name.empty() ? fs::path(cfg.run.dir).filename().string() : m.run_name;
  if (resumed && fs::exists(id_file)) spec.run_id = first_line_of(id_file);
  for (const auto& [key, value] : config::flatten(cfg)) spec.params.emplace_back(key, value);
  spec.tags = system_tags(cfg);
  spec.artifacts = {{(fs::path(cfg.run.dir) / "config.yaml").string(), "config.yaml"}};
  spec.on_run_id = [path = id_file.string()](const std::string& id) {
    try {
      write_text_atomically(path, id + "\n");
    } catch (const std::exception&) {
      // The run goes on; a resumed training then starts another MLflow run.
    }
  };
  try {
    return std::make_unique<tracking::MlflowTracker>(std::move(spec));
  } catch (const tracking::MlflowSetupError& e) {  // the environment changed since the check
    throw setup_error(config::Location{"environment"}, e);
  }
}

}  // namespace trainer::engine
