// Reading a Hugging Face config.json for llama (models/llama_hf.cpp): its fields as transformers
// 4.57 and 5.x read them, the rotary settings in either layout, and the field classification that
// refuses what the trainer does not compute.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::models::llama_hf {

using nlohmann::json;

// Whether `j` is an object holding `key` with a value other than null.
bool present(const json& j, const char* key);

// Field `key` of `j` as an integer (an integral float too), `fallback` when absent or null; an
// error line (`where` + key ...) for another value.
int64_t int_field(const json& j, const char* key, int64_t fallback, const std::string& where,
                  std::vector<std::string>& errors);
double number_field(const json& j, const char* key, double fallback, const std::string& where,
                    std::vector<std::string>& errors);
bool bool_field(const json& j, const char* key, bool fallback, std::vector<std::string>& errors);

// The rotary options of config.json `file` into `o` (rope_theta, rope_scaling none|llama3 and
// llama3's four numbers), read as transformers does: transformers 4's top-level `rope_theta` and
// `rope_scaling`, transformers 5's `rope_parameters` (flat, or one entry per layer type when all
// entries are equal). Error lines for other scalings, for both layouts present and disagreeing,
// and for `rope_type` and `type` disagreeing.
void rope_options(const json& file, json& o, std::vector<std::string>& errors);

// Every field of `file` against transformers' config class of model_type `type` (4.57's and 5.x's
// fields, PretrainedConfig's, and those transformers' modeling code reads from any config): each
// is read (rope_options, options_of_config), checked (an error line for a value llama does not
// compute: hidden_act other than silu, biases, a sliding window in use, partial rotation,
// quantisation, pruned heads, Qwen layer types) or does not change the model; fields no class has
// (transformers ignores them) make one warning naming them.
void check_known_fields(const json& file, const std::string& type, std::vector<std::string>& errors,
                        std::vector<std::string>& warnings);

// `config` (a config.json the export writes, transformers 4's layout) in the layout of `source`,
// the config.json of the folder the run started from: transformers 5's `rope_parameters` (and no
// top-level `rope_theta` or `rope_scaling`) when `source` has rope_parameters, with one entry per
// layer type when `source`'s has.
json in_layout_of(json config, const json& source);

}  // namespace trainer::models::llama_hf
