// The layer rule of docs/architecture.md: every #include "part/..." under src/ and models/ goes
// down the layer order, never up or sideways, and the torch-free parts include no torch header.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// What each part may include besides itself: the parts below it that it uses. A new part, or a
// new dependency, is added here and in docs/architecture.md's picture.
const std::map<std::string, std::set<std::string>>& allowed() {
  static const std::map<std::string, std::set<std::string>> table = {
      {"util", {}},
      {"config", {"util"}},
      {"nn", {"config", "util"}},
      {"models", {"nn", "config", "util"}},
      {"text", {"config", "util"}},
      {"data", {"text", "config", "util"}},
      {"optim", {"nn", "config", "util"}},
      {"losses", {"nn", "config", "util"}},
      {"checkpoint", {"config", "util"}},
      {"distributed", {"nn", "config", "util"}},
      {"tracking", {"util"}},
      {"engine",
       {"distributed", "checkpoint", "models", "data", "text", "optim", "losses", "nn", "tracking",
        "config", "util"}},
      {"doctor", {"config", "util"}},
      {"launch", {"config", "util"}},
      {"cli",
       {"launch", "doctor", "engine", "distributed", "checkpoint", "models", "data", "text",
        "optim", "losses", "nn", "tracking", "config", "util"}},
  };
  return table;
}

// The engine's folders, in order: measure (counting operators, host reads, FLOPs, memory) under
// setup (the parts a run is built from, Hugging Face loading, the results a step reports) under
// persist (the checkpointer and its state parts) and observe (metrics, MLflow, the profiler),
// which never include each other, under loop (the trainer, the step, the evaluator) under use
// (bench, doctor's measurements, generation, the uses of a trained model). What each may include
// of the engine besides itself.
const std::map<std::string, std::set<std::string>>& engine_allowed() {
  static const std::map<std::string, std::set<std::string>> table = {
      {"measure", {}},
      {"setup", {"measure"}},
      {"persist", {"setup", "measure"}},
      {"observe", {"setup", "measure"}},
      {"loop", {"persist", "observe", "setup", "measure"}},
      {"use", {"loop", "persist", "observe", "setup", "measure"}}};
  return table;
}

// The most files one folder under src/ or models/ may hold before it is grouped by concern.
constexpr int kMaxFilesPerFolder = 25;

// Parts whose code must build without LibTorch.
const std::set<std::string>& torch_free() {
  static const std::set<std::string> parts = {"config", "text", "launch", "tracking"};
  return parts;
}

std::set<std::string> engine_names() {
  std::set<std::string> names;
  for (const auto& [folder, _] : engine_allowed()) names.insert(folder);
  return names;
}

std::string join(const std::set<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

// The part a file under `root` belongs to: src/<part>/..., or models/...; "" for others.
std::string part_of(const fs::path& relative) {
  auto it = relative.begin();
  if (it == relative.end()) return "";
  const std::string top = (it++)->string();
  if (top == "models") return "models";
  if (top != "src" || it == relative.end()) return "";
  const std::string part = it->string();
  return ++it == relative.end() ? "" : part;  // src/<file> itself belongs to no part
}

// Within the engine: an include of another engine folder that the folder's rule does not allow.
void check_engine_folder(const fs::path& relative, const std::string& line,
                         const std::string& where, std::vector<std::string>& problems) {
  static const std::regex engine_include(R"(^\s*#\s*include\s+"engine/([a-z_]+)/)");
  auto it = relative.begin();
  std::advance(it, 2);  // src/engine/<folder>/...
  if (it == relative.end()) return;
  const std::string folder = it->string();
  const auto rule = engine_allowed().find(folder);
  if (rule == engine_allowed().end()) {
    problems.push_back(where + "engine/" + folder + " is not an engine folder (" +
                       join(engine_names()) + ")");
    return;
  }
  std::smatch m;
  if (std::regex_search(line, m, engine_include) && m[1] != folder && !rule->second.count(m[1])) {
    problems.push_back(where + "engine/" + folder + " includes engine/" + m[1].str() +
                       "/ (engine/" + folder + " may include: " + join(rule->second) + ")");
  }
}

// One line per include against the rule: "<file>:<line>: <part> includes <other>/ (<part> may
// include: ...)".
std::vector<std::string> check_tree(const fs::path& root) {
  static const std::regex project_include(R"(^\s*#\s*include\s+"([a-z_]+)/)");
  static const std::regex torch_include(R"(^\s*#\s*include\s+[<"](torch|ATen|c10)/)");
  std::vector<std::string> problems;
  std::vector<fs::path> files;
  for (const char* top : {"src", "models"}) {
    if (!fs::is_directory(root / top)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / top)) {
      const auto ext = e.path().extension();
      if (e.is_regular_file() && (ext == ".h" || ext == ".cpp")) files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::map<fs::path, int> per_folder;
  for (const char* top : {"src", "models"}) {
    if (!fs::is_directory(root / top)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / top)) {
      if (e.is_regular_file()) ++per_folder[fs::relative(e.path().parent_path(), root)];
    }
  }
  for (const auto& [folder, count] : per_folder) {
    if (count > kMaxFilesPerFolder) {
      problems.push_back(folder.string() + ": " + std::to_string(count) + " files (at most " +
                         std::to_string(kMaxFilesPerFolder) + "; group them by concern)");
    }
  }
  for (const auto& file : files) {
    const fs::path relative = fs::relative(file, root);
    const std::string part = part_of(relative);
    if (part.empty()) continue;
    const auto rule = allowed().find(part);
    if (rule == allowed().end()) {
      problems.push_back(relative.string() + ": part " + part + " is not in the layer table");
      continue;
    }
    std::ifstream in(file);
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      ++n;
      const std::string where = relative.string() + ":" + std::to_string(n) + ": ";
      std::smatch m;
      if (std::regex_search(line, m, project_include) && m[1] != part &&
          !rule->second.count(m[1])) {
        problems.push_back(where + part + " includes " + m[1].str() + "/ (" + part +
                           " may include: " + join(rule->second) + ")");
      }
      if (part == "engine") check_engine_folder(relative, line, where, problems);
      if (torch_free().count(part) && std::regex_search(line, m, torch_include)) {
        problems.push_back(where + part + " includes " + m[1].str() + "/ (" + part +
                           " builds without LibTorch)");
      }
    }
  }
  std::sort(problems.begin(), problems.end());
  return problems;
}

TEST(Layers, SourceTreeFollowsTheLayerOrder) {
  const auto problems = check_tree(TRAINER_SOURCE_DIR);
  std::string all;
  for (const auto& p : problems) all += p + "\n";
  EXPECT_TRUE(problems.empty()) << all;
}

// The check itself: a tree with an include up the order, one sideways and torch in config.
TEST(Layers, ForbiddenIncludesAreReported) {
  const fs::path root =
      fs::temp_directory_path() / ("trainer_layers_" + std::to_string(::getpid()));
  fs::create_directories(root / "src" / "launch");
  fs::create_directories(root / "src" / "config");
  fs::create_directories(root / "models");
  std::ofstream(root / "src" / "launch" / "launcher.cpp")
      << "#include \"launch/launcher.h\"\n#include \"util/log.h\"\n#include \"cli/options.h\"\n";
  std::ofstream(root / "src" / "config" / "loader.cpp") << "#include <torch/torch.h>\n";
  std::ofstream(root / "models" / "mlp.cpp")
      << "#include \"nn/autocast.h\"\n#include \"data/dataset.h\"\n";
  fs::create_directories(root / "src" / "engine" / "loop");
  std::ofstream(root / "src" / "engine" / "loop" / "step.cpp")
      << "#include \"engine/measure/op_count.h\"\n#include \"engine/use/bench.h\"\n";
  fs::create_directories(root / "src" / "engine" / "persist");
  std::ofstream(root / "src" / "engine" / "persist" / "checkpointer.cpp")
      << "#include \"engine/setup/components.h\"\n#include \"engine/observe/metrics.h\"\n";
  fs::create_directories(root / "src" / "text");
  std::ofstream(root / "src" / "text" / "bpe.cpp") << "#include \"data/dataset.h\"\n";
  fs::create_directories(root / "src" / "data" / "image");
  for (int i = 0; i <= kMaxFilesPerFolder; ++i) {
    std::ofstream(root / "src" / "data" / "image" / ("f" + std::to_string(i) + ".h")) << "\n";
  }
  const auto problems = check_tree(root);
  fs::remove_all(root);
  EXPECT_EQ(problems,
            (std::vector<std::string>{
                "models/mlp.cpp:2: models includes data/ (models may include: config, nn, util)",
                "src/config/loader.cpp:1: config includes torch/ (config builds without LibTorch)",
                "src/data/image: 26 files (at most 25; group them by concern)",
                "src/engine/loop/step.cpp:2: engine/loop includes engine/use/ (engine/loop may "
                "include: measure, observe, persist, setup)",
                "src/engine/persist/checkpointer.cpp:2: engine/persist includes engine/observe/ "
                "(engine/persist may include: measure, setup)",
                "src/launch/launcher.cpp:3: launch includes cli/ (launch may include: config, "
                "util)",
                "src/text/bpe.cpp:1: text includes data/ (text may include: config, util)"}));
}

}  // namespace
