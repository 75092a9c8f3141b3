// tokenizer.json (Hugging Face's tokenizers) to a BpeSpec: what is built is read, anything that
// would encode differently is refused naming its field.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "text/error.h"
#include "text/tokenizer/gpt2_bpe.h"
#include "text/tokenizer/hf_tokenizer.h"
#include "text/tokenizer/hf_tokenizer_reader.h"
#include "util/fileio.h"
#include "util/json_error.h"

namespace trainer::data {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

const char* const kBuilt =
    "trainer reads byte-level BPE tokenizers (GPT-2, Llama 3, Qwen 2/3 and their like)";

[[noreturn]] void unsupported(const std::string& path, const std::string& field,
                              const std::string& what) {
  throw TokenizerUnsupported(path + ": " + field + ": " + what + "; " + kBuilt);
}

// The text of `path`, read once into memory.
std::string read_text(const std::string& path) {
  if (const std::string why = input_problem(path); !why.empty() && fs::exists(path)) {
    throw TokenizerError(why + "; it must be a JSON file");  // a folder or a FIFO
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TokenizerError(path + ": cannot read");
  in.seekg(0, std::ios::end);
  std::string text(static_cast<size_t>(std::max<std::streamoff>(in.tellg(), 0)), '\0');
  in.seekg(0);
  if (!in.read(text.data(), static_cast<std::streamsize>(text.size()))) {
    throw TokenizerError(path + ": cannot read");
  }
  return text;
}

// The JSON document of `path`.
Json read_json(const std::string& path) {
  const std::string text = read_text(path);
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    throw TokenizerError(not_json_message(path, e));
  }
}

// node[key] as a bool: `fallback` when absent or null; DataError when of another type.
bool flag(const Json& node, const char* key, bool fallback, const std::string& path,
          const std::string& where) {
  if (!node.contains(key) || node[key].is_null()) return fallback;
  if (!node[key].is_boolean())
    throw TokenizerError(path + ": " + where + "." + key + ": not true or false");
  return node[key].get<bool>();
}

std::string type_of(const Json& node) {
  return node.is_object() && node.contains("type") && node["type"].is_string()
             ? node["type"].get<std::string>()
             : "";
}

// The ByteLevel pre-tokenizer at `where`: no prefix space; its own regex (GPT-2's) as asked.
void check_byte_level(const Json& node, bool use_regex, const std::string& path,
                      const std::string& where) {
  if (flag(node, "add_prefix_space", true, path, where)) {
    unsupported(path, where + ".add_prefix_space",
                "true (a space put before the text) is not built");
  }
  if (flag(node, "use_regex", true, path, where) != use_regex) {
    unsupported(path, where + ".use_regex",
                use_regex ? "false without a Split before it: text not split into words"
                          : "true after a Split: two patterns one after the other");
  }
}

SplitPattern read_pre_tokenizer(const Json& pt, const std::string& path) {
  const std::string type = type_of(pt);
  if (type == "ByteLevel") {
    check_byte_level(pt, true, path, "pre_tokenizer");
    return SplitPattern::kGpt2;
  }
  if (type != "Sequence") {
    unsupported(path, "pre_tokenizer.type",
                type.empty() ? "none"
                             : "'" + type +
                                   "' (expected ByteLevel, or a Sequence of "
                                   "Split and ByteLevel)");
  }
  const Json& list = pt.contains("pretokenizers") ? pt["pretokenizers"] : Json();
  if (!list.is_array() || list.size() != 2 || type_of(list[0]) != "Split" ||
      type_of(list[1]) != "ByteLevel") {
    unsupported(path, "pre_tokenizer.pretokenizers",
                "expected [Split, ByteLevel], got " + list.dump().substr(0, 120));
  }
  const Json& split = list[0];
  const std::string where = "pre_tokenizer.pretokenizers[0]";
  const Json& pattern = split.contains("pattern") ? split["pattern"] : Json();
  if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string()) {
    unsupported(path, where + ".pattern", "not a Regex: " + pattern.dump().substr(0, 120));
  }
  const std::string regex = pattern["Regex"].get<std::string>();
  const auto known = split_pattern(regex);
  if (!known) {
    unsupported(path, where + ".pattern.Regex",
                "an unknown pattern '" + regex +
                    "' (trainer matches GPT-2's, Llama 3's and Qwen 2's as their tokenizer.json "
                    "files spell them)");
  }
  if (!split.contains("behavior") || split["behavior"] != "Isolated") {
    unsupported(path, where + ".behavior",
                split.value("behavior", Json()).dump() + " (expected \"Isolated\")");
  }
  if (flag(split, "invert", false, path, where)) unsupported(path, where + ".invert", "true");
  check_byte_level(list[1], false, path, "pre_tokenizer.pretokenizers[1]");
  return *known;
}

// The normalizer: none, NFC, or a Sequence of those. True for NFC.
bool read_normalizer(const Json& n, const std::string& path, const std::string& where) {
  if (n.is_null()) return false;
  const std::string type = type_of(n);
  if (type == "NFC") return true;
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    bool nfc = false;
    for (size_t i = 0; i < n["normalizers"].size(); ++i) {
      nfc = read_normalizer(n["normalizers"][i], path,
                            where + ".normalizers[" + std::to_string(i) + "]") ||
            nfc;
    }
    return nfc;
  }
  unsupported(path, where + ".type",
              "'" + type +
                  "' changes text in ways not built (trainer normalizes with NFC or not "
                  "at all)");
}

// The BPE model's options: refused unless as byte-level BPE has them.
void check_model(const Json& model, const std::string& path) {
  if (!model.is_object()) {
    throw TokenizerError(path + ": model: " + model.dump().substr(0, 60) +
                         " is not an object (a BPE model: type, vocab, merges)");
  }
  const std::string type = type_of(model);
  if (type != "BPE" && !(!model.contains("type") && model.contains("merges"))) {
    unsupported(path, "model.type",
                (type.empty() ? model["type"].dump() : "'" + type + "'") + " is not BPE");
  }
  if (flag(model, "byte_fallback", false, path, "model")) {
    unsupported(path, "model.byte_fallback", "true (SentencePiece-style <0x..> byte tokens)");
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    unsupported(path, "model.dropout", model["dropout"].dump() + " (BPE dropout samples merges)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && model[key] != "") {
      unsupported(path, std::string("model.") + key, model[key].dump());
    }
  }
}

void read_model(const Json& model, TokenizerLists& lists, const std::string& path, BpeSpec& spec) {
  check_model(model, path);
  spec.ignore_merges = flag(model, "ignore_merges", false, path, "model");
  if (!lists.vocab_object || lists.tokens.empty()) {
    throw TokenizerError(path + ": model.vocab: no tokens");
  }
  const auto count = static_cast<int64_t>(lists.tokens.size());
  spec.vocab.assign(lists.tokens.size(), "");
  std::vector<bool> taken(lists.tokens.size(), false);
  for (size_t i = 0; i < lists.tokens.size(); ++i) {
    const int64_t id = lists.ids[i];
    if (id < 0 || id >= count) {
      const std::string written =
          id < 0 ? lists.odd[static_cast<size_t>(-1 - id)].dump() : std::to_string(id);
      throw TokenizerError(path + ": model.vocab: token '" + lists.tokens[i] + "' has id " +
                           written + ", not one of 0.." + std::to_string(count - 1));
    }
    const auto at = static_cast<size_t>(id);
    if (taken[at]) {
      throw TokenizerError(path + ": model.vocab: tokens '" + spec.vocab[at] + "' and '" +
                           lists.tokens[i] + "' both have id " + std::to_string(id) +
                           "; each id must be one token's");
    }
    taken[at] = true;
    spec.vocab[at] = std::move(lists.tokens[i]);
  }
  lists.tokens = {};
  if (!lists.merges_array) throw TokenizerError(path + ": model.merges: not a list");
  if (lists.bad_merge >= 0) {
    throw TokenizerError(path + ": model.merges[" + std::to_string(lists.bad_merge) +
                         "]: " + lists.bad_merge_text + " is not two tokens");
  }
  spec.merges = std::move(lists.merges);
}

void read_added(const Json& added, const std::string& path, BpeSpec& spec) {
  if (added.is_null()) return;
  if (!added.is_array()) throw TokenizerError(path + ": added_tokens: not a list");
  for (size_t i = 0; i < added.size(); ++i) {
    const Json& t = added[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("content") || !t["content"].is_string() ||
        !t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0) {
      throw TokenizerError(path + ": " + where + ": not an added token with a content and an id");
    }
    if (flag(t, "single_word", false, path, where)) {
      unsupported(path, where + ".single_word", "true (matched only as a whole word)");
    }
    spec.added.push_back(
        {t["content"].get<std::string>(), t["id"].get<int64_t>(),
         flag(t, "special", false, path, where), flag(t, "lstrip", false, path, where),
         flag(t, "rstrip", false, path, where), flag(t, "normalized", true, path, where)});
  }
}

// A token named by tokenizer_config.json: a string, or an object with its content; null: none.
// `where` (FILE: KEY) names it in the error for anything else.
std::string token_name(const Json& v, const std::string& where = "") {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  if (!where.empty() && !v.is_null()) {
    throw TokenizerError(where + ": " + v.dump().substr(0, 60) +
                         " is not a token (a string, an object with its \"content\", or null)");
  }
  return "";
}

// The first special token of a TemplateProcessing post-processor (alone or in a Sequence, as
// Llama 3.1's); "" when there is none.
std::string template_bos(const Json& post) {
  if (type_of(post) == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
    for (const Json& p : post["processors"]) {
      if (type_of(p) == "TemplateProcessing") return template_bos(p);
    }
  }
  if (type_of(post) != "TemplateProcessing" || !post.contains("single") ||
      !post["single"].is_array() || post["single"].empty()) {
    return "";
  }
  const Json& first = post["single"][0];
  if (!first.is_object() || !first.contains("SpecialToken")) return "";
  return token_name(first["SpecialToken"].value("id", Json()));
}

// Refuses a token tokenizer_config.json's `key` names that `spec` (read from `path`) lacks:
// transformers adds such a token after the tokenizer's ids, where the model has no embedding.
void check_named(const std::string& token, const BpeSpec& spec, const std::string& path,
                 const std::string& config, const std::string& key) {
  if (token.empty()) return;
  const auto is_it = [&](const AddedToken& a) { return a.content == token; };
  if (std::find(spec.vocab.begin(), spec.vocab.end(), token) != spec.vocab.end() ||
      std::any_of(spec.added.begin(), spec.added.end(), is_it)) {
    return;
  }
  int64_t ids = static_cast<int64_t>(spec.vocab.size());
  for (const AddedToken& a : spec.added) ids = std::max(ids, a.id + 1);
  throw TokenizerError(config + ": " + key + " \"" + token.substr(0, 60) + "\" is no token of " +
                       path + " (neither in model.vocab nor in added_tokens; transformers would " +
                       "add it as a new token, id " + std::to_string(ids) +
                       ", which the model has no embedding for); name one of its tokens, or " +
                       "null for none");
}

// bos and eos: tokenizer_config.json's, else the post-processor's first special token for bos.
void read_bos_eos(const Json& root, const std::string& path, const std::string& config,
                  BpeSpec& spec) {
  spec.added_bos = template_bos(root.value("post_processor", Json()));
  spec.bos = spec.added_bos;
  if (config.empty()) return;
  const Json c = read_json(config);
  if (!c.is_object()) throw TokenizerError(config + ": not a JSON object");
  if (c.contains("bos_token")) {
    spec.bos = token_name(c["bos_token"], config + ": bos_token");
    check_named(spec.bos, spec, path, config, "bos_token");
  }
  if (c.contains("eos_token")) {
    spec.eos = token_name(c["eos_token"], config + ": eos_token");
    check_named(spec.eos, spec, path, config, "eos_token");
  }
}

}  // namespace

BpeSpec read_tokenizer_json(const std::string& path, const std::string& config) {
  TokenizerLists lists;
  const Json root = read_tokenizer_document(read_text(path), path, lists);
  if (!root.is_object() || !root.contains("model")) {
    throw TokenizerError(path + ": not a tokenizer.json (no \"model\")");
  }
  BpeSpec spec;
  spec.source = path;
  check_model(root["model"], path);
  spec.nfc = read_normalizer(root.value("normalizer", Json()), path, "normalizer");
  spec.pattern = read_pre_tokenizer(root.value("pre_tokenizer", Json()), path);
  const Json& decoder = root.contains("decoder") ? root["decoder"] : Json();
  if (type_of(decoder) != "ByteLevel") {
    unsupported(path, "decoder.type",
                (decoder.is_null() ? std::string("none") : "'" + type_of(decoder) + "'") +
                    " (expected ByteLevel)");
  }
  read_model(root["model"], lists, path, spec);
  read_added(root.value("added_tokens", Json()), path, spec);
  read_bos_eos(root, path, config, spec);
  return spec;
}

BpeTokenizer load_tokenizer(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / "tokenizer.json", ec)) {
      const fs::path config = dir / "tokenizer_config.json";
      return BpeTokenizer(read_tokenizer_json((dir / "tokenizer.json").string(),
                                              fs::exists(config, ec) ? config.string() : ""));
    }
    if (fs::exists(dir / "encoder.json", ec)) return BpeTokenizer(read_gpt2_bpe(path));
    throw TokenizerError(path +
                         ": no tokenizer.json in this folder (nor GPT-2's encoder.json and "
                         "vocab.bpe); give a Hugging Face model folder or a tokenizer.json file");
  }
  if (!fs::is_regular_file(path, ec)) {
    throw TokenizerError(
        path +
        (fs::exists(path, ec) ? ": not a regular file or folder" : ": no such file or folder") +
        "; give a tokenizer.json file or a folder holding one");
  }
  const fs::path config = fs::path(path).parent_path() / "tokenizer_config.json";
  return BpeTokenizer(read_tokenizer_json(path, fs::exists(config, ec) ? config.string() : ""));
}

}  // namespace trainer::data
