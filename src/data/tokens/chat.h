// Chat data (data.name: chat): conversations in JSONL files, JSON array files (each element as a
// JSONL line: data/tokens/json_array.h), or rows of Parquet and Arrow stream files
// (data/formats/arrow_rows.h; a row is read as the JSON object of its columns, a null value as
// an absent key, and is then a record as a JSONL line is), as text/chat/chat_records.h
// reads them (records in the Alpaca and ShareGPT formats rewritten into them,
// text/chat/record_formats.h), rendered
// with the model's chat template (text/chat/chat_template.h: the published Llama 3.x and ChatML
// templates, recognised from tokenizer_config.json, or forced with data.chat_template) and
// tokenized with its tokenizer (text/tokenizer/hf_tokenizer.h), as transformers'
// apply_chat_template does; data.train_on says which tokens train (text/chat/chat_encode.h).
//
// A sample is one conversation (data.pack: false) or several packed into one row (best fit
// decreasing), data.seq_len tokens long: inputs a conversation's tokens but its last, targets the
// tokens after them, kIgnoreTarget where a token does not train or the row is padding. Packed
// rows carry Batch::positions, so that no token attends across a conversation's boundary. A
// conversation longer than seq_len + 1 tokens is cut to it; one whose first trained token is cut
// off is dropped and counted. The samples are fixed at start, so an epoch's order (the loader's)
// and a batch's index resume exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/issues.h"
#include "data/dataset.h"
#include "text/chat/chat_template.h"
#include "text/chat/record_formats.h"

namespace trainer::data {

// The `data.` keys of chat.
struct ChatOptions {
  std::string files;      // the training files (.jsonl, .parquet, .arrow): a brace pattern
                          // (data/tokens/shards.h) with wildcards, relative to data.root when set;
                          // empty: data.root itself (a file, or a folder whose files are read in
                          // name order, or a data set folder's training split: jsonl_files.h)
  std::string val_files;  // the validation files, a pattern as `files`; empty: a seeded
                          // data.val_fraction of the training conversations
  double val_fraction = 0.1;  // without val_files: each conversation's chance to validate
  int64_t seq_len = 0;    // tokens per sample; 0: the longest conversation's, at most the model's
                          // context length
  std::string tokenizer;  // a tokenizer.json or a folder holding one (with tokenizer_config.json
                          // and its chat template); empty: model.pretrained's folder
  std::string chat_template = "auto";  // auto (recognised from the tokenizer's folder), or a
                                       // format of chat_format_names()
  std::string train_on = "assistant";  // assistant, all, last or completion (chat_encode.h)
  bool pack = false;                   // several conversations per sample, block-causal
  std::string chat_date;  // Llama 3.1 and 3.2's "Today Date" ("26 Jul 2024"); empty: the
                          // template's own (3.1: 26 Jul 2024; 3.2: today, as transformers), which
                          // a training run resolves once and records (chat_dated_today)
  std::string format = "auto";  // the records' format (text/chat/record_formats.h): auto (by
                                // their keys), messages, alpaca, sharegpt, prompt_completion
  // Column and role names of records that name them otherwise (RecordMapping); "": the format's.
  std::string messages_key, role_key, content_key, system_key;
  std::string instruction_key, input_key, output_key, history_key;
  std::string user_role, assistant_role, system_role, tool_role, tool_call_role;

  template <class V>
  void visit(V& v) {
    v("files", files);
    v("val_files", val_files);
    v("val_fraction", val_fraction);
    v("seq_len", seq_len);
    v("tokenizer", tokenizer);
    v("chat_template", chat_template);
    v("train_on", train_on);
    v("pack", pack);
    v("chat_date", chat_date);
    v("format", format);
    v("messages_key", messages_key);
    v("role_key", role_key);
    v("content_key", content_key);
    v("system_key", system_key);
    v("instruction_key", instruction_key);
    v("input_key", input_key);
    v("output_key", output_key);
    v("history_key", history_key);
    v("user_role", user_role);
    v("assistant_role", assistant_role);
    v("system_role", system_role);
    v("tool_role", tool_role);
    v("tool_call_role", tool_call_role);
  }
  // The record format and names these keys set (format must be valid: validate() checks it).
  RecordMapping record_mapping() const;
  void validate(config::Checks& c) const;
};

// Whether a run on the data section `cfg` renders today's date (data.name chat, no
// data.chat_date, and a format dated today: Llama 3.2's, forced or recognised in the tokenizer's
// folder), which the run then resolves once and records as data.chat_date. Reads only the
// template; false where the data set would refuse its settings.
bool chat_dated_today(const config::DataConfig& cfg, const DataContext& ctx);

// One split's conversations, tokenized, end to end.
struct ChatConversations {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;        // per token: 1 where it is a trained target
  std::vector<int64_t> offsets = {0};  // conversation c: tokens [offsets[c], offsets[c + 1])
  std::vector<int32_t> file;           // per conversation: its file, an index into `files`
  std::vector<int64_t> line;  // per conversation: its line (1-based; an array element's first
                              // line), or row (from 0)
  std::vector<std::string> files;
  std::vector<uint8_t> rows;  // per file: 1 where its records are rows (Parquet, Arrow)

  int64_t size() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t length(int64_t c) const { return offsets[c + 1] - offsets[c]; }
  // "FILE:LINE", or "FILE: row N" (as data/formats/arrow_rows.h names rows).
  std::string name(int64_t c) const { return record_name(file[c], line[c]); }
  std::string record_name(int32_t f, int64_t number) const {
    const auto i = static_cast<size_t>(f);
    return files[i] + (i < rows.size() && rows[i] ? ": row " : ":") + std::to_string(number);
  }
};

struct ChatData {
  ChatConversations train, val;
  ChatFormat format = ChatFormat::chatml;
  int64_t vocab_size = 0;  // one more than the tokenizer's largest id
  int64_t pad_id = 0;      // the input of padding positions
  int64_t skipped = 0;     // records dropped: empty conversations, none with a trained token
};

// The conversations of the data section `cfg` (name chat), read, rendered and tokenized on all
// cores; lines it drops (empty conversations, none with a trained token) are warned about and
// counted. Files are read one at a time, Parquet and Arrow ones by batches of rows, never whole.
// Without data.val_files, row N of a file draws its split as line N + 1 of a JSONL file does (a
// Parquet file of a JSONL file's lines splits as that file). Throws DataConfigError for settings
// and records that cannot be used (a line that is not a chat record names its file and line, a
// row its file, row and column; a file that is not Parquet or an Arrow stream, truncated or
// corrupt, names the file), DataError for unreadable files.
ChatData read_chat_data(const config::DataConfig& cfg, const DataContext& ctx);

// The samples of one split of `conversations` (a conversation, or a token row of
// data/tokens/token_rows.cpp, each): one a sample, or packed (best fit decreasing), seq_len
// tokens, padding `pad` masked; `split` ("chat train") names them in the log line on what they
// hold. Throws DataConfigError naming data.seq_len when no conversation keeps a trained token.
std::shared_ptr<const Dataset> conversation_split(ChatConversations&& conversations,
                                                  const char* split, int64_t seq_len, bool packed,
                                                  int64_t pad);

}  // namespace trainer::data
