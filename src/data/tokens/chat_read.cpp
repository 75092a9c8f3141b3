// Reading chat data: the files, the tokenizer and its chat template, and every record (a JSONL
// line, or a Parquet or Arrow row as the JSON of its columns; in the OpenAI form, or rewritten
// into it from data.format's, text/chat/record_formats.h) rendered and tokenized on all cores
// (data/tokens/chat.h).
#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/formats/arrow_rows.h"
#include "data/tokens/chat.h"
#include "data/tokens/json_array.h"
#include "data/tokens/jsonl_files.h"
#include "data/tokens/shards.h"
#include "text/chat/chat_encode.h"
#include "text/chat/chat_records.h"
#include "text/chat/record_formats.h"
#include "text/files.h"
#include "text/tokenizer/hf_tokenizer.h"
#include "util/fileio.h"
#include "util/format.h"
#include "util/hash.h"
#include "util/log.h"

namespace trainer::data {
namespace {

// One record of a file: a JSONL line, an element of a JSON array file, or a row's JSON.
struct Line {
  int32_t file = 0;
  int64_t number = 0;  // a line's, 1-based (an array element's first line); a row's, from 0
  std::string_view text;
  int64_t draw = 0;  // > 0: the number that draws its split (an array element's index + 1)
};

// What became of a line.
struct LineResult {
  EncodedChat chat;
  std::string fatal;    // not usable: the message (FILE:LINE: ...)
  std::string dropped;  // dropped with a warning: why
};

BpeTokenizer open_tokenizer(const std::string& path) {
  try {
    return load_tokenizer(path);
  } catch (const TokenizerUnsupported& e) {
    throw DataConfigError("data.tokenizer", e.what());
  }
}

// The path of message `i` of a record in its JSON.
std::string message_path(const ChatRecord& r, size_t i) {
  if (!r.prompt_completion) return "messages[" + std::to_string(i) + "]";
  return i < r.completion_from ? "prompt[" + std::to_string(i) + "]"
                               : "completion[" + std::to_string(i - r.completion_from) + "]";
}

// Where in a record the template refused it: "messages[1].tool_calls", or "\"tools\"" for the
// record's own key.
std::string render_error_path(const ChatRecord& r, const ChatRenderError& e) {
  if (e.message() == ChatRenderError::kRecord) return "\"" + e.field() + "\"";
  return message_path(r, e.message()) + "." + e.field();
}

LineResult encode_line(const Line& line, const std::string& where, const RecordMapping& mapping,
                       const ChatEncoder& encoder, BpeTokenizer::PieceCache& cache) {
  LineResult out;
  ChatRecord record;
  try {
    const auto rewritten = normalize_chat_line(line.text, mapping, where);
    record = parse_chat_record(rewritten ? std::string_view(*rewritten) : line.text, where);
  } catch (const ChatRecordError& e) {
    out.fatal = e.what();
    return out;
  }
  if (record.messages.empty()) {
    out.dropped = "an empty conversation";
    return out;
  }
  if (encoder.train_on() == TrainOn::completion && !record.prompt_completion) {
    out.fatal = where +
                ": data.train_on: completion trains the completion of {\"prompt\", "
                "\"completion\"} records, and this is a \"messages\" one (use assistant or last)";
    return out;
  }
  try {
    out.chat = encoder.encode(record, &cache);
  } catch (const ChatRenderError& e) {
    out.fatal = where + ": " + render_error_path(record, e) + ": " + e.what() +
                (e.field() == "role" ? "; render other roles with scripts/render_chat.py" : "");
    return out;
  }
  if (std::find(out.chat.trained.begin(), out.chat.trained.end(), 1) == out.chat.trained.end()) {
    out.dropped = "no token to train (data.train_on: " +
                  train_on_names()[static_cast<size_t>(encoder.train_on())] + ")";
  }
  return out;
}

// Every line encoded, on up to `threads` threads; the results in line order. `names` names the
// records (its files and rows).
std::vector<LineResult> encode_lines(const std::vector<Line>& lines, const ChatConversations& names,
                                     const RecordMapping& mapping, const ChatEncoder& encoder) {
  std::vector<LineResult> results(lines.size());
  const size_t threads = std::max<size_t>(
      1, std::min<size_t>({std::thread::hardware_concurrency(), 16, lines.size() / 64 + 1}));
  constexpr size_t kChunk = 64;
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(threads);
  auto work = [&](size_t t) {
    BpeTokenizer::PieceCache cache;
    try {
      for (size_t begin; (begin = next.fetch_add(kChunk)) < lines.size();) {
        for (size_t i = begin; i < std::min(lines.size(), begin + kChunk); ++i) {
          const auto& l = lines[i];
          results[i] = encode_line(l, names.record_name(l.file, l.number), mapping, encoder, cache);
        }
      }
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return results;
}

// The non-blank lines of file `f`, whose bytes are `text`.
std::vector<Line> split_into_lines(int32_t f, std::string_view text) {
  std::vector<Line> lines;
  int64_t number = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    const auto line = text.substr(at, end - at);
    ++number;
    if (!blank_line(line)) lines.push_back({f, number, line});
    at = end + 1;
  }
  return lines;
}

void append(ChatConversations& to, const Line& line, EncodedChat&& chat) {
  to.ids.insert(to.ids.end(), chat.ids.begin(), chat.ids.end());
  to.trained.insert(to.trained.end(), chat.trained.begin(), chat.trained.end());
  to.offsets.push_back(static_cast<int64_t>(to.ids.size()));
  to.file.push_back(line.file);
  to.line.push_back(line.number);
}

// A row's JSON as a record: null values of objects (a struct's field or a column a record lacks,
// as datasets writes them) are absent keys.
void drop_nulls(nlohmann::ordered_json& value) {
  if (value.is_array()) {
    for (auto& item : value) drop_nulls(item);
    return;
  }
  if (!value.is_object()) return;
  for (auto it = value.begin(); it != value.end();) {
    if (it->is_null()) {
      it = value.erase(it);
    } else {
      drop_nulls(*it++);
    }
  }
}

// Reading the records of the files into the splits, a file (or a batch of rows) at a time.
struct RecordReader {
  const RecordMapping& mapping;
  const ChatEncoder& encoder;
  size_t first_val = 0;   // the files from it on validate
  bool root_key = false;  // the training files are data.root's (else data.files')
  double val_fraction = 0;
  uint64_t seed = 0;
  ChatData& data;
  int64_t dropped = 0;

  static constexpr size_t kRowsPerBatch = 4096;

  // The key of file `f`'s problems.
  std::string key(size_t f) const {
    return f >= first_val ? "data.val_files" : root_key ? "data.root" : "data.files";
  }

  void read_file_records(size_t f);
  void read_jsonl(size_t f);
  void read_rows(size_t f);
  void take(const std::vector<Line>& lines);
};

void RecordReader::read_file_records(size_t f) {
  if (data.train.rows[f]) {
    read_rows(f);
  } else {
    read_jsonl(f);
  }
}

void RecordReader::read_jsonl(size_t f) {
  const auto bytes = read_file(data.train.files[f]);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (!starts_json_array(text)) return take(split_into_lines(static_cast<int32_t>(f), text));
  std::vector<Line> lines;
  try {
    for (const auto& e : json_array_elements(text, data.train.files[f])) {
      lines.push_back({static_cast<int32_t>(f), e.line, e.text, e.index + 1});
    }
  } catch (const JsonArrayError& e) {
    throw DataConfigError(key(f), e.what());
  }
  take(lines);
}

// The rows of file `f` by batches of kRowsPerBatch, each row as the JSON text of its columns.
void RecordReader::read_rows(size_t f) {
  const std::string& path = data.train.files[f];
  try {
    ArrowRows rows(path);
    nlohmann::ordered_json row;
    std::vector<std::string> texts;
    for (;;) {
      texts.clear();
      const int64_t first = rows.position();
      while (texts.size() < kRowsPerBatch && rows.next(row)) {
        drop_nulls(row);
        texts.push_back(row.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
      }
      if (texts.empty()) break;
      std::vector<Line> lines;
      lines.reserve(texts.size());
      for (size_t i = 0; i < texts.size(); ++i) {
        lines.push_back({static_cast<int32_t>(f), first + static_cast<int64_t>(i), texts[i]});
      }
      take(lines);
    }
  } catch (const ArrowRowsError& e) {
    throw DataConfigError(key(f), e.what());
  }
}

// The lines' records encoded, the first that cannot be used refused, the others into the splits: a
// line of a validation file validates; without validation files, a line validates with chance
// `val_fraction`, drawn from (seed, file, line number; row N as line N + 1, array element i as line
// i + 1).
void RecordReader::take(const std::vector<Line>& lines) {
  auto results = encode_lines(lines, data.train, mapping, encoder);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (results[i].fatal.empty()) continue;
    throw DataConfigError(key(static_cast<size_t>(lines[i].file)), results[i].fatal);
  }
  const bool drawn = first_val == data.train.files.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto& l = lines[i];
    auto& r = results[i];
    if (!r.dropped.empty()) {
      if (++dropped <= 5) {
        log::warn("chat: " + data.train.record_name(l.file, l.number) + ": " + r.dropped +
                  "; skipped");
      }
      continue;
    }
    const auto number =
        static_cast<uint64_t>(l.draw > 0 ? l.draw : l.number + (data.train.rows[l.file] ? 1 : 0));
    const bool val =
        drawn ? drawn_for_validation(seed, static_cast<uint64_t>(l.file), number, val_fraction)
              : static_cast<size_t>(l.file) >= first_val;
    append(val ? data.val : data.train, l, std::move(r.chat));
  }
}

}  // namespace

bool chat_dated_today(const config::DataConfig& cfg, const DataContext& ctx) {
  if (cfg.name != "chat") return false;
  const auto& o = cfg.own<ChatOptions>();
  if (!o.chat_date.empty()) return false;
  std::string path = o.tokenizer.empty() ? ctx.pretrained : o.tokenizer;
  if (o.tokenizer.empty() && is_file(path)) path = tokenizer_folder(path);  // a safetensors file
  const auto format = find_chat_format(o.chat_template, tokenizer_folder(path));
  return format && chat_format_dated_today(*format);
}

ChatData read_chat_data(const config::DataConfig& cfg, const DataContext& ctx) {
  const auto& o = cfg.own<ChatOptions>();
  std::string path = o.tokenizer.empty() ? ctx.pretrained : join_path("", o.tokenizer);
  if (path.empty()) {
    throw DataConfigError("data.tokenizer",
                          "set it to a tokenizer.json or a Hugging Face model folder (or set "
                          "model.pretrained to one)");
  }
  if (!is_file(path) && !is_directory(path)) {
    throw DataConfigError(o.tokenizer.empty() ? "model.pretrained" : "data.tokenizer",
                          not_a_file(path, true));
  }
  if (o.tokenizer.empty() && is_file(path)) path = tokenizer_folder(path);  // a safetensors file
  const BpeTokenizer tokenizer = open_tokenizer(path);
  const ChatFormat format = pick_chat_format(o.chat_template, tokenizer_folder(path));
  const ChatSpecials specials = chat_specials(tokenizer, format, o.chat_date);
  if (chat_format_dated_today(format) && o.chat_date.empty()) {
    log::warn("chat: the " + chat_format_name(format) +
              " template dates its system header today (" + chat_today() +
              "), as transformers renders it; set data.chat_date to keep a resume on another "
              "day exact");
  }
  std::unique_ptr<ChatEncoder> encoder;
  try {
    encoder =
        std::make_unique<ChatEncoder>(tokenizer, format, specials, *train_on_named(o.train_on));
  } catch (const ChatEncodeError& e) {
    throw DataConfigError("data.chat_template", e.what());
  }
  const auto val = o.val_files.empty() ? std::vector<std::string>()
                                       : pattern_files(cfg.root, o.val_files, "data.val_files");
  ChatData data;
  data.format = format;
  data.vocab_size = tokenizer.vocab_size();
  const int64_t eot = tokenizer.end_of_text();
  data.pad_id = eot >= 0 ? eot : std::max<int64_t>(0, tokenizer.eos_id());
  data.train.files =
      train_files(cfg.root, o.files, val, "conversations", {".jsonl", ".parquet", ".arrow"});
  const size_t first_val = data.train.files.size();
  data.train.files.insert(data.train.files.end(), val.begin(), val.end());
  for (const auto& f : data.train.files) data.train.rows.push_back(is_rows_file(f) ? 1 : 0);
  data.val.files = data.train.files;
  data.val.rows = data.train.rows;
  const RecordMapping mapping = o.record_mapping();
  RecordReader reader{mapping,
                      *encoder,
                      first_val,
                      o.files.empty(),
                      o.val_fraction,
                      static_cast<uint64_t>(ctx.seed),
                      data};
  for (size_t f = 0; f < data.train.files.size(); ++f) reader.read_file_records(f);
  data.skipped = reader.dropped;
  if (reader.dropped > 5) {
    log::warn(strprintf("chat: %lld records skipped in all (the first 5 above)",
                        static_cast<long long>(reader.dropped)));
  }
  return data;
}

}  // namespace trainer::data
