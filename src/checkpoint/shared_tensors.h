// One tensor under several names (a tied weight: gpt's lm_head.weight is transformer.wte.weight)
// stored once, as safetensors' save_model stores shared tensors: the other names go into the
// file's metadata and come back on loading, sharing the stored tensor.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/safetensors.h"

namespace trainer::checkpoint {

// The metadata key: {name left out: the name it is stored under}, as JSON.
constexpr const char* kAliasesKey = "trainer.aliases";

// `tensors` without those viewing the same memory as an earlier one alike (the same storage,
// offset, shape, strides, dtype and device), each named in `metadata`[kAliasesKey].
inline NamedTensors stored_once(const NamedTensors& tensors,
                                std::map<std::string, std::string>& metadata) {
  using View = std::tuple<const void*, int64_t, std::vector<int64_t>, std::vector<int64_t>,
                          torch::ScalarType, std::string>;
  std::map<View, std::string> first;
  nlohmann::json aliases = nlohmann::json::object();
  NamedTensors out;
  for (const auto& [name, t] : tensors) {
    if (t.defined() && t.numel() > 0 && t.has_storage()) {
      const View view{t.storage().data(), t.storage_offset(), t.sizes().vec(),
                      t.strides().vec(),  t.scalar_type(),    t.device().str()};
      const auto [it, fresh] = first.emplace(view, name);
      if (!fresh) {
        aliases[name] = it->second;
        continue;
      }
    }
    out.emplace_back(name, t);
  }
  if (!aliases.empty()) metadata[kAliasesKey] = aliases.dump();
  return out;
}

// Adds the tensors `file` stores once under another name (its kAliasesKey) back under their own
// names, sharing the stored tensor. Returns "" or what is wrong with the metadata.
inline std::string restore_aliases(SafetensorsFile& file) {
  const auto it = file.metadata.find(kAliasesKey);
  if (it == file.metadata.end()) return "";
  std::map<std::string, torch::Tensor> stored(file.tensors.begin(), file.tensors.end());
  try {
    const auto aliases = nlohmann::json::parse(it->second);
    for (const auto& [name, target] : aliases.items()) {
      const auto t = stored.find(target.get<std::string>());
      if (t == stored.end()) {
        return "'" + name + "' is stored as " + target.dump() + ", which the file does not hold";
      }
      file.tensors.emplace_back(name, t->second);
    }
  } catch (const nlohmann::json::exception& e) {
    return std::string("unreadable '") + kAliasesKey + "' metadata: " + e.what();
  }
  return "";
}

}  // namespace trainer::checkpoint
