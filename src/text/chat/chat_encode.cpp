#include "text/chat/chat_encode.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <string_view>
#include <utility>

#include "text/error.h"
#include "text/files.h"
#include "text/unicode/unicode_nfc.h"
#include "util/json_error.h"
#include "util/log.h"

namespace trainer::data {
namespace {

const std::array<std::pair<TrainOn, const char*>, 4> kTrainOn = {{
    {TrainOn::assistant, "assistant"},
    {TrainOn::all, "all"},
    {TrainOn::last, "last"},
    {TrainOn::completion, "completion"},
}};

bool llama(ChatFormat f) {
  return f == ChatFormat::llama3 || f == ChatFormat::llama31 || f == ChatFormat::llama32;
}

// Where byte `b` of `text` lies in the text the tokenizer reads (NFC applied where it normalizes).
// Spans start and end after a newline or a special token, where NFC of a prefix is a prefix of
// NFC of the text.
size_t tokenized_offset(const std::string& text, size_t b, bool normalize) {
  return normalize ? nfc(std::string_view(text).substr(0, b)).size() : b;
}

// The chat template text of `folder` (chat_template.jinja, else tokenizer_config.json's
// chat_template: a string, or the entry named "default" of a list); `source` names the file.
std::string folder_template(const std::string& folder, std::string& source) {
  source = folder + "/chat_template.jinja";
  if (is_file(source)) {
    const auto bytes = read_file(source);
    return std::string(bytes.begin(), bytes.end());
  }
  source = folder + "/tokenizer_config.json";
  if (!is_file(source)) return "";
  const auto bytes = read_file(source);
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    throw DataError(not_json_message(source, e));
  }
  const auto t = config.find("chat_template");
  if (t == config.end() || t->is_null()) return "";
  if (t->is_string()) return t->get<std::string>();
  if (t->is_array()) {
    for (const auto& entry : *t) {
      if (entry.is_object() && entry.value("name", nlohmann::json()) == "default" &&
          entry.value("template", nlohmann::json()).is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    return "";
  }
  throw DataConfigError("data.chat_template",
                        source + ": chat_template is " + t->dump().substr(0, 60) +
                            ", not a template's text (a string, or a list of {\"name\", "
                            "\"template\"}); set data.chat_template to the format it renders");
}

// Why `tokenizer` has no bos for the chat format `name`: the tokenizer_config.json beside its
// tokenizer.json (the one load_tokenizer reads) names none, nor does its post-processor add one.
std::string no_bos_text(const BpeTokenizer& tokenizer, const std::string& name) {
  const std::filesystem::path source(tokenizer.source());
  const auto folder = source.has_parent_path() ? source.parent_path() : std::filesystem::path(".");
  const std::string config = (folder / "tokenizer_config.json").string();
  const std::string why =
      is_file(config) ? config + ": bos_token is missing or null"
                      : folder.string() + " has no tokenizer_config.json " + "naming a bos_token";
  return why + ", and " + tokenizer.source() + "'s post-processor adds no bos; the " + name +
         " chat format starts with it: set bos_token to its beginning-of-text token "
         "(\"<|begin_of_text|>\")";
}

}  // namespace

ChatFormat pick_chat_format(const std::string& chat_template, const std::string& folder) {
  const std::string formats = "llama3|llama3.1|llama3.2|chatml|qwen2|qwen2.5|qwen3|plain";
  if (chat_template != "auto") {
    if (const auto named = chat_format_named(chat_template)) return *named;
    throw DataConfigError("data.chat_template", "\"" + chat_template + "\" is none of " + formats);
  }
  std::string source;
  const std::string text = folder_template(folder, source);
  if (text.empty()) {
    throw DataConfigError("data.chat_template",
                          folder +
                              " has no chat template (tokenizer_config.json's chat_template "
                              "or chat_template.jinja); set data.chat_template: " +
                              formats +
                              ", or render the data with scripts/render_chat.py into token "
                              "files for data.name: tokens");
  }
  const auto format = recognize_chat_template(text);
  if (!format) {
    throw DataConfigError("data.chat_template",
                          source +
                              ": its chat template is none of the published ones built in "
                              "(Llama 3, 3.1, 3.2 Instruct; Qwen 2, 2.5, 3; plain ChatML); "
                              "set data.chat_template: " +
                              formats +
                              " to the format it renders, or render the data with "
                              "scripts/render_chat.py into token files for data.name: tokens");
  }
  log::info("chat: " + source + " holds the published " + chat_format_name(*format) + " template");
  return *format;
}

std::optional<ChatFormat> find_chat_format(const std::string& chat_template,
                                           const std::string& folder) {
  if (chat_template != "auto") return chat_format_named(chat_template);
  try {
    std::string source;
    return recognize_chat_template(folder_template(folder, source));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

ChatSpecials chat_specials(const BpeTokenizer& tokenizer, ChatFormat format,
                           const std::string& date) {
  const auto text = [&](int64_t id) { return id >= 0 ? tokenizer.id_to_token(id) : ""; };
  ChatSpecials specials;
  const bool plain = format == ChatFormat::plain;
  specials.bos = text(plain ? tokenizer.added_bos_id() : tokenizer.bos_id());
  specials.eos = text(tokenizer.eos_id());
  specials.date = date;
  return specials;
}

const std::vector<std::string>& train_on_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [mode, name] : kTrainOn) out.push_back(name);
    return out;
  }();
  return names;
}

std::optional<TrainOn> train_on_named(const std::string& name) {
  for (const auto& [mode, n] : kTrainOn) {
    if (name == n) return mode;
  }
  return std::nullopt;
}

ChatEncoder::ChatEncoder(const BpeTokenizer& tokenizer, ChatFormat format, ChatSpecials specials,
                         TrainOn train_on)
    : tokenizer_(tokenizer), format_(format), specials_(std::move(specials)), train_on_(train_on) {
  const std::string name = chat_format_name(format);
  for (const auto& token : chat_format_tokens(format)) {
    if (tokenizer.encode(token).size() != 1) {
      throw ChatEncodeError(tokenizer.source() + " has no special token " + token + "; the " +
                            name + " chat format needs it");
    }
  }
  if (llama(format) && specials_.bos.empty()) throw ChatEncodeError(no_bos_text(tokenizer, name));
  // NFC composes e + U+0301 into U+00E9.
  normalizes_ = tokenizer.decode(tokenizer.encode("e\xCC\x81")) == "\xC3\xA9";
}

std::vector<std::pair<size_t, size_t>> ChatEncoder::trained_spans(const ChatRecord& record,
                                                                  const RenderedChat& chat) const {
  std::vector<std::pair<size_t, size_t>> spans;
  switch (train_on_) {
    case TrainOn::all:
      spans.emplace_back(0, chat.text.size());
      break;
    case TrainOn::assistant:
      for (const auto& t : chat.turns) spans.emplace_back(t.begin, t.end);
      break;
    case TrainOn::last:
      if (!chat.turns.empty()) spans.emplace_back(chat.turns.back().begin, chat.turns.back().end);
      break;
    case TrainOn::completion:
      for (const auto& t : chat.turns) {
        if (t.message == record.completion_from) spans.emplace_back(t.begin, chat.text.size());
      }
      break;
  }
  return spans;
}

std::vector<int64_t> ChatEncoder::generation_prompt(
    const std::vector<ChatMessage>& messages) const {
  return tokenizer_.encode(render_generation_prompt(format_, messages, specials_),
                           /*allow_special=*/true);
}

int64_t ChatEncoder::end_of_turn_id() const {
  const std::string text = chat_end_of_turn(format_, specials_);
  if (text.empty()) return -1;
  const auto ids = tokenizer_.encode(text, /*allow_special=*/true);
  return ids.size() == 1 ? ids[0] : -1;
}

EncodedChat ChatEncoder::encode(const ChatRecord& record, BpeTokenizer::PieceCache* cache) const {
  const RenderedChat chat = render_chat(format_, record.messages, specials_, record.tools);
  EncodedChat out;
  tokenizer_.encode_into(chat.text, /*allow_special=*/true, cache, out.ids);
  // Each token's bytes, end to end, spell the text the tokenizer read.
  std::vector<size_t> end(out.ids.size());
  size_t at = 0;
  for (size_t k = 0; k < out.ids.size(); ++k) {
    at += tokenizer_.token_bytes(out.ids[k]).size();
    end[k] = at;
  }
  const bool normalize = normalizes_ && !nfc_quick_check(chat.text);
  if (at != tokenized_offset(chat.text, chat.text.size(), normalize)) {
    throw DataError(tokenizer_.source() +
                    ": its tokens do not spell a rendered conversation back (an added token "
                    "that strips whitespace?); render this data with scripts/render_chat.py");
  }
  out.trained.assign(out.ids.size(), 0);
  for (const auto& [b, e] : trained_spans(record, chat)) {
    if (b >= e) continue;
    const size_t lo = tokenized_offset(chat.text, b, normalize);
    const size_t hi = tokenized_offset(chat.text, e, normalize);
    // The tokens whose bytes [end[k-1], end[k]) overlap [lo, hi).
    for (size_t k = std::upper_bound(end.begin(), end.end(), lo) - end.begin();
         k < end.size() && (k == 0 ? 0 : end[k - 1]) < hi; ++k) {
      if (k > 0) out.trained[k] = 1;
    }
  }
  return out;
}

}  // namespace trainer::data
