#include "text/tokenizer/gpt2_bpe.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "text/error.h"
#include "util/json_error.h"

namespace trainer::data {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw TokenizerError(
        path + ": cannot read (a GPT-2 tokenizer folder holds encoder.json and vocab.bpe)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// encoder.json: token -> id, into the vocabulary by id. Throws DataError naming `path`.
std::vector<std::string> read_encoder(const std::string& path) {
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw TokenizerError(not_json_message(path, e));
  }
  if (!encoder.is_object() || encoder.empty()) {
    throw TokenizerError(path + ": not a JSON object of tokens and their ids");
  }
  // Ids name rows of the model's output: at most one per token, and none beyond the count.
  const auto most = static_cast<int64_t>(encoder.size());
  std::vector<std::string> vocab(encoder.size());
  for (const auto& [token, id] : encoder.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      throw TokenizerError(path + ": token '" + token + "' has no id");
    if (id.get<int64_t>() >= most) {
      throw TokenizerError(path + ": token '" + token + "' has id " +
                           std::to_string(id.get<int64_t>()) + ", beyond its " +
                           std::to_string(most) + " tokens (ids run from 0)");
    }
    auto& slot = vocab[static_cast<size_t>(id.get<int64_t>())];
    if (!slot.empty()) {
      throw TokenizerError(path + ": tokens '" + slot + "' and '" + token + "' both have id " +
                           std::to_string(id.get<int64_t>()) + "; each id must be one token's");
    }
    slot = token;
  }
  return vocab;
}

}  // namespace

BpeSpec read_gpt2_bpe(const std::string& dir) {
  BpeSpec spec;
  const std::string enc_path = dir + "/encoder.json", bpe_path = dir + "/vocab.bpe";
  spec.source = enc_path;
  spec.vocab = read_encoder(enc_path);
  spec.pattern = SplitPattern::kGpt2;
  std::istringstream lines(read_text(bpe_path));
  int64_t line_number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const auto space = line.find(' ');
    if (space == std::string::npos) {
      throw TokenizerError(bpe_path + ":" + std::to_string(line_number) + ": the merge '" + line +
                           "' is not two tokens separated by a space");
    }
    spec.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  if (spec.merges.empty()) throw TokenizerError(bpe_path + ": no merges");
  for (size_t id = 0; id < spec.vocab.size(); ++id) {
    if (spec.vocab[id] == "<|endoftext|>") {
      // As GPT-2's tokenizer.json: a special token, normalized.
      spec.added.push_back({spec.vocab[id], static_cast<int64_t>(id), true, false, false, true});
      spec.bos = spec.eos = spec.vocab[id];
    }
  }
  return spec;
}

}  // namespace trainer::data
