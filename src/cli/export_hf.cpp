#include "cli/export_hf.h"

#include <torch/torch.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <vector>

#include "checkpoint/hf_folder.h"
#include "cli/commands.h"
#include "models/model.h"
#include "util/fileio.h"
#include "util/log.h"

namespace trainer::cli {

namespace fs = std::filesystem;

namespace {

const std::map<std::string, c10::ScalarType>& dtypes() {
  static const std::map<std::string, c10::ScalarType> names = {
      {"float32", torch::kFloat}, {"bfloat16", torch::kBFloat16}, {"float16", torch::kHalf}};
  return names;
}

// The pretrained folder the run started from (model.pretrained: DIR), or "".
std::string source_folder(const HfExport& e) {
  const auto& c = e.config;
  if (!c.contains("model.pretrained") || !c["model.pretrained"].is_string()) return "";
  const std::string dir = c["model.pretrained"].get<std::string>();
  if (dir.empty()) return "";
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    log::warn("export: the run's model.pretrained " + dir +
              " is gone; its tokenizer files and token ids are not copied");
    return "";
  }
  if (!checkpoint::is_directory(dir)) return "";
  if (fs::equivalent(dir, e.out, ec)) {
    throw UsageError("--out " + e.out +
                     " is the run's model.pretrained folder; exporting there would replace the "
                     "weights it was initialised from; choose another --out");
  }
  return dir;
}

// The folder's config.json, or null when it cannot be read (with a warning).
nlohmann::json source_config(const std::string& dir) {
  if (dir.empty()) return nullptr;
  try {
    return checkpoint::read_json_object((fs::path(dir) / "config.json").string());
  } catch (const checkpoint::FormatError& e) {
    log::warn(std::string("export: ") + e.what() + "; its token ids are not copied");
    return nullptr;
  }
}

// The dtype to write: --dtype, or (auto) the source's config.json's, else the weights'.
c10::ScalarType export_dtype(const std::string& option, const nlohmann::json& source,
                             c10::ScalarType weights) {
  if (option != "auto") {
    const auto it = dtypes().find(option);
    if (it == dtypes().end()) {
      throw UsageError("--dtype: expected auto, float32, bfloat16 or float16, got '" + option +
                       "'");
    }
    return it->second;
  }
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (source.is_object() && source.contains(key) && source[key].is_string()) {
      const auto it = dtypes().find(source[key].get<std::string>());
      if (it != dtypes().end()) return it->second;
    }
  }
  return weights;
}

std::string dtype_name(c10::ScalarType t) {
  for (const auto& [name, type] : dtypes()) {
    if (type == t) return name;
  }
  return "float32";
}

// generation_config.json: the source folder's, else the token ids of config.json.
std::string generation_config(const std::string& source, const nlohmann::json& config) {
  if (!source.empty()) {
    const auto file = fs::path(source) / "generation_config.json";
    std::error_code ec;
    if (fs::is_regular_file(file, ec)) {
      const auto bytes = read_bytes(file.string());
      return std::string(bytes.begin(), bytes.end());
    }
  }
  nlohmann::json g = {{"_from_model_config", true}};
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (config.contains(key) && !config[key].is_null()) g[key] = config[key];
  }
  return g.dump(2) + "\n";
}

// A string of the run's flattened config, or "".
std::string config_string(const HfExport& e, const char* key) {
  const auto& c = e.config;
  return c.contains(key) && c[key].is_string() ? c[key].get<std::string>() : std::string();
}

// Where the tokenizer files come from: --tokenizer, else the run's data.tokenizer (chat data),
// else its model.pretrained folder (a folder, or the folder of a weights file in one); "" for
// none. A path from the run that is gone is a warning and "".
std::string tokenizer_source(const HfExport& e, const std::string& pretrained_folder) {
  if (!e.tokenizer.empty()) {
    std::error_code ec;
    if (!fs::exists(e.tokenizer, ec)) {
      throw UsageError("--tokenizer " + e.tokenizer +
                       ": no such file or folder (a tokenizer.json, a folder holding one, or "
                       "GPT-2's encoder.json and vocab.bpe)");
    }
    return e.tokenizer;
  }
  const std::string data = config_string(e, "data.tokenizer");
  std::error_code ec;
  if (!data.empty()) {
    if (fs::exists(data, ec)) return data;
    log::warn("export: the run's data.tokenizer " + data + " is gone; its files are not copied");
  }
  if (!pretrained_folder.empty()) return pretrained_folder;
  const std::string pretrained = config_string(e, "model.pretrained");
  if (!pretrained.empty() && fs::is_regular_file(pretrained, ec)) {
    return fs::path(pretrained).parent_path().string();  // a weights file in a model folder
  }
  return "";
}

// Copies `from` to `out`/`name`; returns `name`.
std::string copy_file(const fs::path& from, const std::string& out, const std::string& name) {
  const auto bytes = read_bytes(from.string());
  write_atomically((fs::path(out) / name).string(),
                   [&](const ByteSink& sink) { sink(bytes.data(), bytes.size()); });
  return name;
}

// Copies the tokenizer files of `source` (tokenizer_source()) into `out` under the names
// transformers' AutoTokenizer reads: a folder's Hugging Face tokenizer files (GPT-2's encoder.json
// and vocab.bpe as vocab.json and merges.txt, which they are), a tokenizer.json file with the
// files beside it. Returns their names.
std::vector<std::string> copy_tokenizer_files(const std::string& source, const std::string& out) {
  std::vector<std::string> copied;
  if (source.empty()) return copied;
  std::error_code ec;
  const bool file = fs::is_regular_file(source, ec);
  const fs::path dir = file ? fs::path(source).parent_path() : fs::path(source);
  for (const auto& name : checkpoint::hf_side_files(dir.empty() ? "." : dir.string())) {
    if (name == "generation_config.json" || (file && name == "tokenizer.json")) continue;
    copied.push_back(copy_file(dir / name, out, name));
  }
  if (file) {
    copied.push_back(copy_file(source, out, "tokenizer.json"));
  } else if (!fs::exists(dir / "vocab.json", ec) && !fs::exists(dir / "tokenizer.json", ec) &&
             fs::is_regular_file(dir / "encoder.json", ec) &&
             fs::is_regular_file(dir / "vocab.bpe", ec)) {
    copied.push_back(copy_file(dir / "encoder.json", out, "vocab.json"));
    copied.push_back(copy_file(dir / "vocab.bpe", out, "merges.txt"));
  }
  return copied;
}

// config.json: the model's, with the source's token ids.
nlohmann::json with_source_ids(nlohmann::json config, const nlohmann::json& source) {
  if (!source.is_object()) return config;
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (source.contains(key)) config[key] = source[key];
  }
  return config;
}

}  // namespace

uint64_t parse_shard_size(const std::string& text) {
  static const std::map<std::string, double> units = {
      {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"", 1}};
  size_t end = 0;
  while (end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) {
    ++end;
  }
  std::string unit = text.substr(end);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const auto it = units.find(unit);
  double value = 0;
  try {
    value = end > 0 ? std::stod(text.substr(0, end)) : 0;
  } catch (const std::exception&) {
    value = 0;
  }
  if (it == units.end() || !(value * it->second >= 1) || !std::isfinite(value)) {
    throw UsageError(
        "--max-shard-size: expected a size such as 5GB, 500MB or a number of bytes, "
        "got '" +
        text + "'");
  }
  return static_cast<uint64_t>(value * it->second);
}

int export_hf(const HfExport& e, const checkpoint::NamedTensors& weights) {
  const auto& hf = models::model_registry().get(e.model).hf;
  if (!hf || !hf->from_trainer) {
    throw UsageError("--format hf: " + e.checkpoint + " holds a " + e.model +
                     ", which has no Hugging Face layout here (gpt and llama have)");
  }
  std::map<std::string, std::string> flat;
  for (const auto& [key, value] : e.config.items()) {
    if (value.is_string()) flat[key] = value.get<std::string>();
  }
  std::pair<models::NamedWeights, nlohmann::json> converted;
  try {
    converted = hf->from_trainer(weights, flat);
  } catch (const models::ModelError& error) {
    throw UsageError("--format hf: " + e.checkpoint + ": " + error.what());
  }
  auto& [tensors, config] = converted;
  const std::string source = source_folder(e);
  const auto source_json = source_config(source);
  const auto dtype = export_dtype(
      e.dtype, source_json, tensors.empty() ? torch::kFloat : tensors[0].second.scalar_type());
  for (auto& [name, t] : tensors) {
    if (t.is_floating_point()) t = t.to(dtype);
  }
  config = with_source_ids(config, source_json);
  config["torch_dtype"] = dtype_name(dtype);
  if (hf->in_layout_of) config = hf->in_layout_of(config, source_json);
  std::error_code ec;
  fs::create_directories(e.out, ec);
  if (ec) throw UsageError("--out " + e.out + ": cannot create the folder: " + ec.message());
  const auto files = checkpoint::write_hf_weights(e.out, tensors, e.max_shard_bytes);
  write_text_atomically((fs::path(e.out) / "config.json").string(), config.dump(2) + "\n");
  write_text_atomically((fs::path(e.out) / "generation_config.json").string(),
                        generation_config(source, config));
  std::string written;
  for (const auto& name : copy_tokenizer_files(tokenizer_source(e, source), e.out)) {
    written += ", " + name;
  }
  std::cout << "wrote " << e.out << ": " << hf->name << " (" << config.value("model_type", "")
            << ", " << dtype_name(dtype) << "), " << tensors.size() << " tensors in "
            << (files.size() > 1 ? files.size() - 1 : 1) << " safetensors files, config.json, "
            << "generation_config.json" << written << "\n";
  return 0;
}

}  // namespace trainer::cli
