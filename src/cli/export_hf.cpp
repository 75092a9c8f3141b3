#include "cli/export_hf.h"

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <vector>

#include "checkpoint/hf_folder.h"
#include "cli/commands.h"
#include "cli/tokenizer_option.h"
#include "models/model.h"
#include "util/fileio.h"
#include "util/format.h"
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
  return checkpoint::is_directory(dir) ? dir : "";  // never --out (export.cpp's check_not_base)
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

// Whether folder `dir` holds a tokenizer AutoTokenizer reads: tokenizer.json, tokenizer.model,
// vocab.json, or GPT-2's encoder.json and vocab.bpe.
bool holds_tokenizer(const fs::path& dir) {
  std::error_code ec;
  for (const char* name : {"tokenizer.json", "tokenizer.model", "vocab.json"}) {
    if (fs::is_regular_file(dir / name, ec)) return true;
  }
  return fs::is_regular_file(dir / "encoder.json", ec) &&
         fs::is_regular_file(dir / "vocab.bpe", ec);
}

// Where the tokenizer files come from: --tokenizer, else the run's data.tokenizer (chat data),
// else its model.pretrained folder (a folder, or the folder of a weights file in one); "" for
// none. A path from the run that is gone is a warning and "". UsageError for a --tokenizer that
// does not exist or is a folder without a tokenizer.
std::string tokenizer_source(const HfExport& e, const std::string& pretrained_folder) {
  if (!e.tokenizer.empty()) {
    std::error_code ec;
    const char* const kinds =
        "a tokenizer.json, a folder holding one, or GPT-2's encoder.json and vocab.bpe";
    if (!fs::exists(e.tokenizer, ec)) {
      throw UsageError("--tokenizer " + e.tokenizer + ": no such file or folder (" + kinds + ")");
    }
    if (fs::is_directory(e.tokenizer, ec) && !holds_tokenizer(e.tokenizer)) {
      throw UsageError("--tokenizer " + e.tokenizer + ": the folder holds no tokenizer (" + kinds +
                       ", or tokenizer.model); name the folder or file of the model's tokenizer");
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

// One more than the largest id of a JSON object's values (token -> id), or `n` if larger.
int64_t ids_bound(const nlohmann::json& map, int64_t n) {
  if (!map.is_object()) return n;
  for (const auto& id : map) {
    if (id.is_number_integer()) n = std::max(n, id.get<int64_t>() + 1);
  }
  return n;
}

// The number of token ids the tokenizer at `source` (tokenizer_source()) gives, one more than
// the largest, as its files list them: tokenizer.json's model vocabulary (a map, or Unigram's
// list) and added_tokens, else vocab.json's or GPT-2's encoder.json's with added_tokens.json; 0
// when its files list none (tokenizer.model alone). UsageError naming a file that is not JSON.
int64_t tokenizer_vocabulary(const std::string& source) {
  std::error_code ec;
  const bool file = fs::is_regular_file(source, ec);
  const fs::path dir = file ? fs::path(source).parent_path() : fs::path(source);
  const auto json_of = [](const fs::path& path) {
    try {
      return checkpoint::read_json_object(path.string());
    } catch (const checkpoint::FormatError& e) {
      throw UsageError(std::string("--tokenizer: ") + e.what());
    }
  };
  const fs::path tokenizer_json = file ? fs::path(source) : dir / "tokenizer.json";
  if (fs::is_regular_file(tokenizer_json, ec)) {
    const auto json = json_of(tokenizer_json);
    const auto model = json.value("model", nlohmann::json::object());
    const auto vocab =
        model.is_object() ? model.value("vocab", nlohmann::json()) : nlohmann::json();
    int64_t n = vocab.is_array() ? static_cast<int64_t>(vocab.size()) : ids_bound(vocab, 0);
    for (const auto& added : json.value("added_tokens", nlohmann::json::array())) {
      if (added.is_object() && added.contains("id") && added["id"].is_number_integer()) {
        n = std::max(n, added["id"].get<int64_t>() + 1);
      }
    }
    return n;
  }
  int64_t n = 0;
  if (fs::is_regular_file(dir / "vocab.json", ec)) {
    n = ids_bound(json_of(dir / "vocab.json"), 0);
  } else if (fs::is_regular_file(dir / "encoder.json", ec)) {
    n = ids_bound(json_of(dir / "encoder.json"), 0);
  }
  if (n > 0 && fs::is_regular_file(dir / "added_tokens.json", ec)) {
    n = ids_bound(json_of(dir / "added_tokens.json"), n);
  }
  return n;
}

// UsageError when the model of `config` (config.json's vocab_size) lacks ids the tokenizer at
// `tokenizer` gives, as generate refuses the pair.
void check_tokenizer_fits(const HfExport& e, const std::string& tokenizer,
                          const nlohmann::json& config) {
  if (tokenizer.empty() || !config.contains("vocab_size") ||
      !config["vocab_size"].is_number_integer()) {
    return;
  }
  require_vocabulary_holds(
      config["vocab_size"].get<int64_t>(), tokenizer_vocabulary(tokenizer),
      e.tokenizer.empty() ? "export: the tokenizer of " + tokenizer : "--tokenizer " + tokenizer);
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
  const auto usage = [&](const std::string& why) {
    return UsageError("--max-shard-size: " + why + ", got '" + text + "'");
  };
  const double bytes = parse_size(text);
  if (!(bytes >= 1)) throw usage("expected a size such as 5GB, 500MB or a number of bytes");
  // A byte count beyond what a file's size can be (2^64 bytes and up) would wrap: refused.
  const char* const too_large = "the largest size is 18446744073709551615 bytes (18446744TB)";
  if (text.find_first_not_of("0123456789") == std::string::npos) {
    try {
      return std::stoull(text);  // exactly, beyond a double's 53 bits
    } catch (const std::out_of_range&) {
      throw usage(too_large);
    }
  }
  if (bytes >= 18446744073709551616.0) throw usage(too_large);
  return static_cast<uint64_t>(bytes);
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
  const std::string tokenizer = tokenizer_source(e, source);
  check_tokenizer_fits(e, tokenizer, config);
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
  for (const auto& name : copy_tokenizer_files(tokenizer, e.out)) written += ", " + name;
  std::cout << "wrote " << e.out << ": " << hf->name << " (" << config.value("model_type", "")
            << ", " << dtype_name(dtype) << "), " << tensors.size() << " tensors in "
            << (files.size() > 1 ? files.size() - 1 : 1) << " safetensors files, config.json, "
            << "generation_config.json" << written << "\n";
  return 0;
}

}  // namespace trainer::cli
