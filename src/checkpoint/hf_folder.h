// Hugging Face model folders, as transformers' save_pretrained writes them: config.json, the
// weights in model.safetensors or in the shards model.safetensors.index.json lists
// ({"metadata": {...}, "weight_map": {tensor: "model-0000k-of-0000n.safetensors"}}),
// generation_config.json and the tokenizer's files. Reading opens every weight file's header and
// leaves the data on disk (SafetensorsReader), so a model loads one tensor at a time.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace trainer::checkpoint {

// Whether `path` is a directory (a Hugging Face folder rather than one safetensors file).
bool is_directory(const std::string& path);

// The JSON object in file `path`. Throws FormatError naming the file when it cannot be read or
// holds something else than a JSON object.
nlohmann::json read_json_object(const std::string& path);

// A folder's weights: each safetensors file opened (its header read and checked) and where each
// tensor lies.
struct HfWeights {
  std::string index;         // the index file's path; "" for model.safetensors
  std::string unread_index;  // an index beside model.safetensors, not read (as transformers)
  std::vector<SafetensorsReader> files;  // in the order of their names
  struct Where {
    size_t file = 0;                          // in `files`
    const SafetensorsEntry* entry = nullptr;  // in files[file]
  };
  std::map<std::string, Where> tensors;  // every tensor of the folder by name
  uint64_t bytes = 0;                    // the tensors' bytes, all files together
};

// Opens the weights of folder `dir` in transformers' from_pretrained precedence: model.safetensors
// when it exists (an index beside it and its shards are not read), else the shards
// model.safetensors.index.json lists. Throws FormatError naming the file and, where one is at
// fault, the tensor: neither file exists; the index is not JSON or lacks its weight_map; it names
// a shard that does not exist or is malformed or truncated, a tensor its shard does not hold, or a
// shard outside the folder; a shard holds a tensor the index puts in another shard or does not
// list; a tensor lies in two files.
HfWeights open_hf_weights(const std::string& dir);

// The files of folder `dir` that open_hf_weights reads, by path, in the order of their names:
// model.safetensors, else the index and the shards it lists that exist (the index alone when it
// is not a readable index). None when neither exists. Never throws.
std::vector<std::string> hf_weight_files(const std::string& dir);

// Which files `weights` were read from, for the log: "model.safetensors", with "(DIR's
// model.safetensors.index.json and its shards not read, as transformers)" when an index lies
// beside it, or "model.safetensors.index.json and its N shards (FIRST .. LAST)".
std::string hf_files_read(const HfWeights& weights);

// The names of the files of folder `dir` that describe the tokenizer and generation and that
// exist (tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model,
// vocab.json, merges.txt, added_tokens.json, chat_template.jinja, generation_config.json, ...).
std::vector<std::string> hf_side_files(const std::string& dir);

// The end-of-sequence token ids of folder `dir`: generation_config.json's eos_token_id (one id or a
// list, as Llama 3's instruct models give <|end_of_text|>, <|eom_id|> and <|eot_id|>), else
// config.json's; none when neither file gives one. Throws FormatError naming a file that exists
// but is not JSON or whose eos_token_id is neither an id nor a list of ids.
std::vector<int64_t> hf_eos_token_ids(const std::string& dir);

// The shards save_pretrained's split makes of tensors of `bytes` (in this order), each shard at
// most `max_shard_bytes` unless one tensor alone is larger: the tensors' positions, shard by
// shard, in order (huggingface_hub's split_torch_state_dict_into_shards).
std::vector<std::vector<size_t>> plan_shards(const std::vector<uint64_t>& bytes,
                                             uint64_t max_shard_bytes);

// Writes `tensors` (unique names, each tensor on any device) into folder `dir` as save_pretrained
// does: one model.safetensors when they fit into `max_shard_bytes`, else
// model-0000k-of-0000n.safetensors and model.safetensors.index.json (metadata total_size and
// total_parameters, the weight_map). Each file is written atomically, the index last; weight
// files of an earlier save that this one does not write (model.safetensors or another shard
// count's) are removed. Returns the names of the files written. Throws IoError.
std::vector<std::string> write_hf_weights(const std::string& dir, const NamedTensors& tensors,
                                          uint64_t max_shard_bytes);

}  // namespace trainer::checkpoint
