// Preference data (data.name: preference): pairs of completions to one prompt, a chosen and a
// rejected one, for train.objective: dpo (engine/loop/preference_step.h). JSONL records in TRL's
// two formats:
//
//   {"prompt": "...", "chosen": "...", "rejected": "..."}                           (standard)
//   {"prompt": [messages...], "chosen": [messages...], "rejected": [messages...]} (conversational)
//
// or the same as one JSON array of records (data/tokens/json_array.h), or as the rows of Parquet
// and Arrow stream files (data/formats/arrow_rows.h) with TRL's columns: prompt (optional), chosen
// and rejected, strings or lists of {role, content} structs; a row is the record of its columns.
//
// "prompt" may be left out: the implicit prompt is then the longest common prefix of chosen and
// rejected (characters, or whole messages), as trl.extract_prompt takes it. Tokenized as TRL
// 1.16's DPOTrainer does (_prepare_dataset): text with the tokenizer's bos (as encode with special
// tokens) and the completions ending in its eos (added when missing); messages with the model's
// chat template (text/chat/chat_template.h), the prompt with the generation prompt, each
// completion as the tokens of the template applied to prompt + completion after the tokens the
// two share with the prompt's. A pair whose prompt reaches data.max_length tokens is dropped and
// counted; every row is cut to its first max_length tokens.
//
// A sample is one pair; a batch of P pairs is 2P rows, the P chosen ones then the P rejected ones,
// each its prompt and completion right-padded to the batch's longest row: inputs the tokens,
// targets the next tokens where they are completion tokens (kIgnoreTarget elsewhere, the last
// column always).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "config/issues.h"
#include "data/dataset.h"
#include "text/chat/chat_template.h"
#include "text/tokenizer/hf_tokenizer.h"

namespace trainer::data {

// The `data.` keys of preference.
struct PreferenceDataOptions {
  std::string files;          // the training files (JSONL, JSON array, Parquet, Arrow): a brace
                              // pattern relative to data.root; empty: data.root itself (a file
                              // or a folder of .jsonl, .parquet and .arrow files)
  std::string val_files;      // the validation files; empty: a seeded data.val_fraction
  double val_fraction = 0.1;  // without val_files: each pair's chance to validate
  int64_t max_length = 1024;  // tokens per row (prompt + completion), TRL's max_length
  std::string tokenizer;      // a tokenizer.json or a folder; empty: model.pretrained's folder
  std::string chat_template = "auto";  // conversational records: auto or a chat format's name
  std::string chat_date;               // Llama 3.1 and 3.2's "Today Date" (data.name chat's)

  template <class V>
  void visit(V& v) {
    v("files", files);
    v("val_files", val_files);
    v("val_fraction", val_fraction);
    v("max_length", max_length);
    v("tokenizer", tokenizer);
    v("chat_template", chat_template);
    v("chat_date", chat_date);
  }
  void validate(config::Checks& c) const;
};

// One split's pairs, tokenized: pair k's prompt, chosen and rejected completions are
// ids[offsets[3k] .. offsets[3k + 1]), [offsets[3k + 1] .. offsets[3k + 2]) and
// [offsets[3k + 2] .. offsets[3k + 3]).
struct PreferencePairs {
  std::vector<int32_t> ids;
  std::vector<int64_t> offsets = {0};
  std::vector<std::string> where;  // per pair: FILE:LINE, or FILE: row N

  int64_t size() const { return static_cast<int64_t>(where.size()); }
  // Part `part` (0 prompt, 1 chosen, 2 rejected) of pair k.
  std::vector<int32_t> part(int64_t k, int part) const {
    return {ids.begin() + offsets[3 * k + part], ids.begin() + offsets[3 * k + part + 1]};
  }
};

struct PreferenceData {
  PreferencePairs train, val;
  int64_t vocab_size = 0;
  int64_t pad_id = 0;
  int64_t dropped = 0;  // pairs whose prompt reaches max_length
};

// The pairs of the data section `cfg` (name preference), read and tokenized. Throws
// DataConfigError naming FILE:LINE (FILE: row N) and the key for a record that cannot be used (a
// column of another type, a malformed JSON array: FILE:LINE:COLUMN, not JSON, no
// chosen or rejected, an empty completion, formats mixed, a message that is not {role, content},
// roles out of order: a completion that is not the assistant's answer, conversations without a
// prompt that differ before the answers), DataError for unreadable files.
PreferenceData read_preference_data(const config::DataConfig& cfg, const DataContext& ctx);

// A TRL preference record's prompt and completions as tokens.
struct PreferenceTokens {
  std::vector<int32_t> prompt, chosen, rejected;
};

// A line that is not a usable preference record; the message starts with its FILE:LINE.
class PreferenceRecordError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The tokens of one JSONL line (`where`: FILE:LINE) as DPOTrainer makes them, messages rendered in
// `format` (nullopt: the tokenizer has no template; a conversational record then throws
// DataConfigError naming data.chat_template). Throws PreferenceRecordError.
PreferenceTokens tokenize_preference_line(std::string_view line, const std::string& where,
                                          const BpeTokenizer& tokenizer,
                                          std::optional<ChatFormat> format,
                                          const ChatSpecials& specials);

}  // namespace trainer::data
