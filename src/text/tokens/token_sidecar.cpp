#include "text/tokens/token_sidecar.h"

#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <string>

#include "text/error.h"
#include "text/files.h"
#include "text/tokenizer/hf_tokenizer.h"
#include "util/fileio.h"
#include "util/json_error.h"

namespace trainer::data {
namespace {

using Json = nlohmann::json;

constexpr const char* kFormat = "trainer-tokens";
constexpr int kVersion = 1;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

[[noreturn]] void bad(const std::string& sidecar, const std::string& what) {
  throw DataConfigError("data.root", sidecar + ": " + what +
                                         "; it describes a token file as trainer tokenize writes "
                                         "it (rewrite it with trainer tokenize, or remove it)");
}

// The integer at `key` of `j`, at least `least`.
int64_t integer(const Json& j, const char* key, int64_t least, const std::string& sidecar) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < least) {
    bad(sidecar,
        std::string("\"") + key + "\" must be an integer of at least " + std::to_string(least));
  }
  return it->get<int64_t>();
}

}  // namespace

std::string token_sidecar_path(const std::string& token_file) {
  return token_file + ".json";
}

void describe_tokenizer(const BpeTokenizer& tokenizer, TokenSidecar& out) {
  const std::string& source = tokenizer.source();
  std::error_code ec;
  const auto absolute = std::filesystem::absolute(source, ec);
  out.tokenizer_path = ec ? source : absolute.lexically_normal().string();
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::vector<std::string> files{source};
  if (ends_with(source, "encoder.json")) {  // GPT-2's: the merges are in vocab.bpe beside it
    files.push_back(source.substr(0, source.size() - 12) + "vocab.bpe");
  }
  try {
    for (const auto& f : files) {
      const auto bytes = read_file(f);
      XXH64_update(state, bytes.data(), bytes.size());
    }
  } catch (...) {
    XXH64_freeState(state);
    throw;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, static_cast<uint64_t>(XXH64_digest(state)));
  XXH64_freeState(state);
  out.tokenizer_xxh64 = hex;
}

void write_token_sidecar(const std::string& token_file, const TokenSidecar& s) {
  const Json j = {{"format", kFormat},
                  {"version", kVersion},
                  {"dtype", s.dtype},
                  {"tokens", s.tokens},
                  {"vocab_size", s.vocab_size},
                  {"documents", s.documents},
                  {"end_of_text", s.end_of_text},
                  {"tokenizer", {{"path", s.tokenizer_path}, {"xxh64", s.tokenizer_xxh64}}}};
  write_text_atomically(token_sidecar_path(token_file), j.dump(2) + "\n");
}

std::optional<TokenSidecar> read_token_sidecar(const std::string& token_file) {
  const std::string path = token_sidecar_path(token_file);
  if (!is_file(path)) return std::nullopt;
  Json j;
  try {
    const auto bytes = read_file(path);
    j = Json::parse(bytes.begin(), bytes.end());
  } catch (const Json::exception& e) {
    bad(path, "not JSON: " + json_error_text(e));
  }
  if (!j.is_object() || j.value("format", Json()) != kFormat) {
    bad(path, std::string("not an object with \"format\": \"") + kFormat + "\"");
  }
  if (integer(j, "version", 1, path) > kVersion) {
    bad(path, "version " + j["version"].dump() + " is newer than this trainer reads (" +
                  std::to_string(kVersion) + ")");
  }
  TokenSidecar s;
  const auto dtype = j.find("dtype");
  if (dtype == j.end() || (*dtype != "uint16" && *dtype != "uint32")) {
    bad(path, "\"dtype\" must be \"uint16\" or \"uint32\"");
  }
  s.dtype = dtype->get<std::string>();
  s.tokens = integer(j, "tokens", 0, path);
  s.vocab_size = integer(j, "vocab_size", 1, path);
  s.documents = j.contains("documents") ? integer(j, "documents", 0, path) : 0;
  s.end_of_text = j.contains("end_of_text") ? integer(j, "end_of_text", -1, path) : -1;
  const auto tok = j.find("tokenizer");
  if (tok != j.end() && tok->is_object()) {
    const auto text = [&](const char* key) {
      const auto it = tok->find(key);
      return it != tok->end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    s.tokenizer_path = text("path");
    s.tokenizer_xxh64 = text("xxh64");
  }
  return s;
}

}  // namespace trainer::data
