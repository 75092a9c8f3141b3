#include "checkpoint/hf_folder.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <utility>

#include "util/fileio.h"
#include "util/json_error.h"

namespace trainer::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWeights = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

// A shard's name as the index gives it: a file of the folder itself.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name != "." && name != "..";
}

// The index's weight_map: tensor -> shard name. Throws FormatError naming the index.
std::map<std::string, std::string> weight_map(const std::string& index) {
  const auto json = read_json_object(index);
  if (!json.contains("weight_map") || !json["weight_map"].is_object()) {
    throw FormatError(index +
                      ": no \"weight_map\" object (tensor name -> shard file); not a "
                      "safetensors index as save_pretrained writes it");
  }
  std::map<std::string, std::string> map;
  for (auto it = json["weight_map"].begin(); it != json["weight_map"].end(); ++it) {
    if (!it->is_string() || !plain_file_name(it->get<std::string>())) {
      throw FormatError(index + ": weight_map puts tensor '" + it.key() + "' in " + it->dump() +
                        ", not the name of a file in the folder");
    }
    map[it.key()] = it->get<std::string>();
  }
  return map;
}

// Every shard the index names, opened, and each tensor found where the index puts it.
void open_indexed(const std::string& dir, HfWeights& out) {
  const auto map = weight_map(out.index);
  std::map<std::string, std::string> first_tensor;  // shard -> a tensor the index puts there
  for (const auto& [tensor, shard] : map) first_tensor.emplace(shard, tensor);
  std::map<std::string, size_t> file_of;
  for (const auto& [shard, tensor] : first_tensor) {
    const std::string path = join(dir, shard);
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      throw FormatError(out.index + " names shard " + shard + " (holding " + tensor +
                        "), which is not in " + dir + "; copy the folder again, whole");
    }
    file_of[shard] = out.files.size();
    out.files.emplace_back(path);
  }
  for (const auto& [tensor, shard] : map) {
    const size_t f = file_of.at(shard);
    const SafetensorsEntry* entry = out.files[f].find(tensor);
    if (!entry) {
      throw FormatError(out.index + " puts tensor " + tensor + " in " + out.files[f].path() +
                        ", which does not hold it");
    }
    out.tensors[tensor] = {f, entry};
  }
  for (size_t f = 0; f < out.files.size(); ++f) {
    for (const auto& e : out.files[f].entries()) {
      const auto it = map.find(e.name);
      if (it == map.end() || file_of.at(it->second) != f) {
        throw FormatError(out.files[f].path() + " holds tensor " + e.name + ", which " + out.index +
                          (it == map.end() ? " does not list" : " puts in " + it->second));
      }
    }
  }
}

}  // namespace

bool is_directory(const std::string& path) {
  std::error_code ec;
  return !path.empty() && fs::is_directory(path, ec);
}

nlohmann::json read_json_object(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(path + ": cannot be read");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(not_json_message(path, e) +
                      "; fix the file or copy it again from the model's source");
  }
  if (!json.is_object()) throw FormatError(path + ": not a JSON object");
  return json;
}

HfWeights open_hf_weights(const std::string& dir) {
  HfWeights out;
  std::error_code ec;
  const bool index = fs::is_regular_file(join(dir, kIndex), ec);
  if (fs::is_regular_file(join(dir, kWeights), ec)) {  // first, as from_pretrained takes it
    if (index) out.unread_index = join(dir, kIndex);
    out.files.emplace_back(join(dir, kWeights));
    for (const auto& e : out.files[0].entries()) out.tensors[e.name] = {0, &e};
  } else if (index) {
    out.index = join(dir, kIndex);
    open_indexed(dir, out);
  } else {
    const bool bin = fs::exists(join(dir, "pytorch_model.bin"), ec) ||
                     fs::exists(join(dir, "pytorch_model.bin.index.json"), ec);
    throw FormatError(dir + " holds neither " + kWeights + " nor " + kIndex +
                      (bin ? " (pytorch_model.bin is not read: save the model with "
                             "save_pretrained(..., safe_serialization=True))"
                           : ""));
  }
  for (const auto& [name, where] : out.tensors) out.bytes += where.entry->bytes;
  return out;
}

std::vector<std::string> hf_weight_files(const std::string& dir) {
  std::error_code ec;
  if (fs::is_regular_file(join(dir, kWeights), ec)) return {join(dir, kWeights)};
  if (!fs::is_regular_file(join(dir, kIndex), ec)) return {};
  std::set<std::string> files = {join(dir, kIndex)};
  try {
    for (const auto& [tensor, shard] : weight_map(join(dir, kIndex))) {
      if (fs::is_regular_file(join(dir, shard), ec)) files.insert(join(dir, shard));
    }
  } catch (const FormatError&) {
    // not an index: the file alone
  }
  return {files.begin(), files.end()};
}

std::string hf_files_read(const HfWeights& weights) {
  if (weights.index.empty()) {
    const std::string name = fs::path(weights.files.at(0).path()).filename().string();
    return weights.unread_index.empty()
               ? name
               : name + " (" + weights.unread_index +
                     " and its shards beside it not read: transformers reads " + name + " first)";
  }
  const auto name = [&](size_t f) {
    return fs::path(weights.files.at(f).path()).filename().string();
  };
  const size_t n = weights.files.size();
  return std::string(kIndex) + " and its " + std::to_string(n) +
         (n == 1 ? " shard (" : " shards (") + name(0) + (n == 1 ? "" : " .. " + name(n - 1)) + ")";
}

std::vector<std::string> hf_side_files(const std::string& dir) {
  static const char* const kNames[] = {"tokenizer.json",
                                       "tokenizer_config.json",
                                       "special_tokens_map.json",
                                       "tokenizer.model",
                                       "vocab.json",
                                       "merges.txt",
                                       "added_tokens.json",
                                       "chat_template.jinja",
                                       "chat_template.json",
                                       "generation_config.json"};
  std::vector<std::string> out;
  std::error_code ec;
  for (const char* name : kNames) {
    if (fs::is_regular_file(join(dir, name), ec)) out.emplace_back(name);
  }
  return out;
}

std::vector<int64_t> hf_eos_token_ids(const std::string& dir) {
  for (const char* name : {"generation_config.json", "config.json"}) {
    const std::string path = join(dir, name);
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) continue;
    const auto json = read_json_object(path);
    if (!json.contains("eos_token_id") || json["eos_token_id"].is_null()) continue;
    const auto& eos = json["eos_token_id"];
    std::vector<int64_t> ids;
    for (const auto& id : eos.is_array() ? eos : nlohmann::json::array({eos})) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) {
        throw FormatError(path + ": eos_token_id is " + eos.dump() +
                          "; expected a token id or a list of them");
      }
      ids.push_back(id.get<int64_t>());
    }
    return ids;
  }
  return {};
}

std::vector<std::vector<size_t>> plan_shards(const std::vector<uint64_t>& bytes,
                                             uint64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > max_shard_bytes) {  // alone, in a shard of its own
      shards.push_back({i});
      continue;
    }
    if (!current.empty() && current_bytes + bytes[i] > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += bytes[i];
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  return shards;
}

namespace {

std::string shard_name(size_t k, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return name;
}

// Removes the weight files of an earlier save in `dir` that `written` does not name.
void remove_stale_weights(const std::string& dir, const std::set<std::string>& written) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool weights = name == kWeights || name == kIndex || std::regex_match(name, shard);
    if (weights && !written.count(name)) fs::remove(e.path(), ec);
  }
}

}  // namespace

std::vector<std::string> write_hf_weights(const std::string& dir, const NamedTensors& tensors,
                                          uint64_t max_shard_bytes) {
  std::vector<uint64_t> bytes;
  uint64_t total = 0, parameters = 0;
  for (const auto& [name, t] : tensors) {
    bytes.push_back(static_cast<uint64_t>(t.numel()) * t.element_size());
    total += bytes.back();
    parameters += static_cast<uint64_t>(t.numel());
  }
  const auto shards = plan_shards(bytes, max_shard_bytes);
  std::vector<std::string> written;
  nlohmann::json map = nlohmann::json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name = shards.size() == 1 ? kWeights : shard_name(k, shards.size());
    NamedTensors part;
    for (size_t i : shards[k]) {
      part.push_back(tensors[i]);
      map[tensors[i].first] = name;
    }
    write_atomically(join(dir, name), [&](const ByteSink& sink) {
      write_safetensors(part, {{"format", "pt"}}, sink);
    });
    written.push_back(name);
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {
        {"metadata", {{"total_parameters", parameters}, {"total_size", total}}},
        {"weight_map", map}};
    write_text_atomically(join(dir, kIndex), index.dump(2) + "\n");
    written.push_back(kIndex);
  }
  remove_stale_weights(dir, std::set<std::string>(written.begin(), written.end()));
  return written;
}

}  // namespace trainer::checkpoint
