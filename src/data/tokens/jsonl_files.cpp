#include "data/tokens/jsonl_files.h"

#include "util/hash.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "data/tokens/shards.h"
#include "text/error.h"
#include "text/files.h"
#include "util/fileio.h"

namespace trainer::data {
namespace {

bool has_wildcard(const std::string& name) {
  return name.find_first_of("*?[") != std::string::npos;
}

// The files `pattern` (with wildcards) matches, in byte order; none: a DataConfigError.
std::vector<std::string> glob_files(const std::string& pattern, const std::string& key) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) throw DataConfigError(key, pattern + ": cannot be listed");
  if (out.empty()) throw DataConfigError(key, pattern + ": no file matches");
  std::sort(out.begin(), out.end());
  return out;
}

bool named_with(const std::string& name, const std::vector<std::string>& extensions) {
  return std::any_of(extensions.begin(), extensions.end(), [&](const std::string& ext) {
    return name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0;
  });
}

// The files of folder `dir` named with `extensions` (and starting with `prefix`), but `val`.
std::vector<std::string> folder_files(const std::string& dir,
                                      const std::vector<std::string>& extensions,
                                      const std::vector<std::string>& val,
                                      const std::string& prefix = "") {
  std::vector<std::string> out;
  for (const auto& name : list_dir(dir)) {
    const std::string path = dir + "/" + name;
    if (named_with(name, extensions) && name.rfind(prefix, 0) == 0 && is_file(path) &&
        std::find(val.begin(), val.end(), path) == val.end()) {
      out.push_back(path);
    }
  }
  return out;
}

// "JSONL", "JSONL, Parquet or Arrow".
std::string kinds_text(const std::vector<std::string>& extensions) {
  std::string out;
  for (size_t i = 0; i < extensions.size(); ++i) {
    const std::string& e = extensions[i];
    const std::string name = e == ".jsonl"     ? "JSONL"
                             : e == ".parquet" ? "Parquet"
                             : e == ".arrow"   ? "Arrow"
                                               : e.substr(1);
    out += (i == 0 ? "" : i + 1 == extensions.size() ? " or " : ", ") + name;
  }
  return out;
}

}  // namespace

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
  std::vector<std::string> names, out;
  try {
    names = expand_braces(pattern);
  } catch (const std::invalid_argument& e) {
    throw DataConfigError(key, e.what());
  }
  for (const auto& name : names) {
    const std::string path = join_path(root, name);
    if (!has_wildcard(name)) {
      if (!is_file(path)) throw DataConfigError(key, not_a_file(path, false));
      out.push_back(path);
      continue;
    }
    for (auto& f : glob_files(path, key)) {
      if (is_file(f)) out.push_back(std::move(f));
    }
  }
  return out;
}

std::vector<std::string> train_files(const std::string& data_root, const std::string& files,
                                     const std::vector<std::string>& val, const std::string& what,
                                     const std::vector<std::string>& extensions) {
  if (!files.empty()) return pattern_files(data_root, files, "data.files");
  const std::string root = strip_slashes(data_root);
  if (root.empty()) {
    throw DataConfigError("data.root", "set it to a " + kinds_text(extensions) + " file of " +
                                           what + " or a folder of them (or set data.files)");
  }
  if (is_file(root)) return {root};
  if (!is_directory(root)) throw DataConfigError("data.root", not_a_file(root, true));
  auto out = folder_files(root, extensions, val);
  if (out.empty() && is_file(root + "/dataset_dict.json") && is_directory(root + "/train")) {
    out = folder_files(root + "/train", extensions, val);  // save_to_disk of a DatasetDict
  } else if (out.empty() && is_directory(root + "/data")) {
    out = folder_files(root + "/data", extensions, val, "train");  // the Hub's layout
  }
  if (out.empty()) {
    std::string names;
    for (const auto& ext : extensions) names += (names.empty() ? "" : ", ") + ext;
    throw DataConfigError("data.root", root + ": no " + names +
                                           " file in this folder (nor a training split in "
                                           "data/train* or a DatasetDict's train/)");
  }
  return out;
}

std::string tokenizer_folder(const std::string& path) {
  if (is_directory(path)) return strip_slashes(path);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool is_rows_file(const std::string& path) {
  for (const std::string ext : {".parquet", ".arrow"}) {
    if (path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0) {
      return true;
    }
  }
  return false;
}

bool drawn_for_validation(uint64_t seed, uint64_t file, uint64_t number, double fraction) {
  const uint64_t draw = mix_seed(mix_seed(seed, file), number);
  return static_cast<double>(draw >> 11) * 0x1.0p-53 < fraction;
}

}  // namespace trainer::data
