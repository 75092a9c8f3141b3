#include "data/tokens/jsonl_files.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "data/tokens/shards.h"
#include "text/error.h"
#include "text/files.h"
#include "util/fileio.h"

namespace trainer::data {

std::string join_path(const std::string& root, const std::string& name) {
  if (root.empty() || name.empty() || name[0] == '/') return name;
  return strip_slashes(root) + "/" + name;
}

std::string not_a_file(const std::string& path, bool folder_ok) {
  const std::string why = input_problem(path);
  if (is_directory(path)) return why + "; name a JSONL file";
  return why + (folder_ok && !std::filesystem::exists(path) ? " or folder" : "");
}

std::vector<std::string> pattern_files(const std::string& root, const std::string& pattern,
                                       const std::string& key) {
  std::vector<std::string> out;
  try {
    for (const auto& name : expand_braces(pattern)) out.push_back(join_path(root, name));
  } catch (const std::invalid_argument& e) {
    throw DataConfigError(key, e.what());
  }
  for (const auto& f : out) {
    if (!is_file(f)) throw DataConfigError(key, not_a_file(f, false));
  }
  return out;
}

std::vector<std::string> train_files(const std::string& data_root, const std::string& files,
                                     const std::vector<std::string>& val, const std::string& what) {
  if (!files.empty()) return pattern_files(data_root, files, "data.files");
  const std::string root = strip_slashes(data_root);
  if (root.empty()) {
    throw DataConfigError("data.root", "set it to a JSONL file of " + what +
                                           " or a folder of them (or set data.files)");
  }
  if (is_file(root)) return {root};
  if (!is_directory(root)) throw DataConfigError("data.root", not_a_file(root, true));
  std::vector<std::string> out;
  for (const auto& name : list_dir(root)) {
    const std::string path = root + "/" + name;
    const bool jsonl = name.size() > 6 && name.compare(name.size() - 6, 6, ".jsonl") == 0;
    if (jsonl && is_file(path) && std::find(val.begin(), val.end(), path) == val.end()) {
      out.push_back(path);
    }
  }
  if (out.empty()) throw DataConfigError("data.root", root + ": no .jsonl file in this folder");
  return out;
}

std::string tokenizer_folder(const std::string& path) {
  if (is_directory(path)) return strip_slashes(path);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace trainer::data
