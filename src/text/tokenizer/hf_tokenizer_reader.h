// tokenizer.json read in one pass of nlohmann's SAX parser: model.vocab's and model.merges'
// entries taken as plain lists as the parse meets them, the rest of the file as a document. A big
// vocabulary's document would hold each token and merge as its own nodes, about 20 times the
// file (Llama 3's 7 MB tokenizer.json took 140 MB and most of its load time that way).
// Torch-free.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trainer::data {

// model.vocab's and model.merges' entries as written.
struct TokenizerLists {
  bool vocab_object = false;        // whether model.vocab was an object
  bool merges_array = false;        // whether model.merges was a list
  std::vector<std::string> tokens;  // model.vocab's keys, in order
  // Their ids: a non-negative integer as written, or -1 - i for odd[i], a value that is not one
  // (kept as written for messages; "{...}" and "[...]" for an object and a list).
  std::vector<int64_t> ids;
  std::vector<nlohmann::json> odd;
  std::vector<std::pair<std::string, std::string>> merges;  // by rank; {"", ""}: malformed
  int64_t bad_merge = -1;                                   // the first malformed merge's rank
  std::string bad_merge_text;                               // and its JSON
};

// The JSON document of `text` (the contents of `path`) less model.vocab's and model.merges'
// entries (each left as an empty object or list where it is one), those entries put in `lists`.
// Throws DataError "PATH:LINE:COLUMN: not JSON: ..." (util/json_error.h) for text that is not
// JSON. The text is read by hf_tokenizer_scan.h's reader, and again by nlohmann's parser where
// that one stops (the error's message is nlohmann's); `fast` false: by nlohmann's alone (tests
// compare the two).
nlohmann::json read_tokenizer_document(const std::string& text, const std::string& path,
                                       TokenizerLists& lists, bool fast = true);

}  // namespace trainer::data
