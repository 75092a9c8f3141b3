// Reading preference data (data/tokens/preference.h): the records of TRL's standard and
// conversational formats, their implicit prompts, and their tokens as TRL 1.16's DPOTrainer makes
// them.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/tokens/preference.h"
#include "data/tokens/shards.h"
#include "text/chat/chat_encode.h"
#include "text/chat/chat_records.h"
#include "text/chat/chat_template.h"
#include "text/files.h"
#include "text/tokenizer/hf_tokenizer.h"
#include "util/format.h"
#include "util/hash.h"
#include "util/log.h"

namespace trainer::data {
namespace {

using Json = nlohmann::json;

// A record as TRL's formats hold it: text, or lists of messages (conversational).
struct PreferenceRecord {
  bool conversational = false;
  std::string prompt, chosen, rejected;                     // standard
  std::vector<ChatMessage> prompt_m, chosen_m, rejected_m;  // conversational
};

// A record that cannot be used; the message names FILE:LINE and the key.
struct RecordError {
  std::string message;
};

std::vector<ChatMessage> messages_of(const Json& list, const std::string& where,
                                     const std::string& key) {
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& m = list[i];
    const std::string at = where + ": " + key + "[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      throw RecordError{at + ": a message is an object with string \"role\" and \"content\""};
    }
    ChatMessage message{m["role"].get<std::string>(), m["content"].get<std::string>(), {}};
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string()) {
      message.reasoning = m["reasoning_content"].get<std::string>();
    }
    out.push_back(std::move(message));
  }
  return out;
}

bool same(const ChatMessage& a, const ChatMessage& b) {
  return a.role == b.role && a.content == b.content && a.reasoning == b.reasoning;
}

// trl.extract_prompt: the prompt ends where chosen and rejected first differ, less a space just
// before that (it goes to the completions); where they do not differ within the shorter one, at
// its last element (Python's loop variable after a loop without break). {end, differed}.
template <class Seq, class Eq>
std::pair<size_t, bool> implicit_prompt_end(const Seq& chosen, const Seq& rejected, Eq eq) {
  const size_t n = std::min(chosen.size(), rejected.size());
  for (size_t idx = 0; idx < n; ++idx) {
    if (!eq(chosen[idx], rejected[idx])) return {idx, true};
  }
  return {n == 0 ? 0 : n - 1, false};
}

void split_text_prompt(PreferenceRecord& r) {
  auto [idx, differed] =
      implicit_prompt_end(r.chosen, r.rejected, [](char a, char b) { return a == b; });
  if (differed && idx > 0 && r.chosen[idx - 1] == ' ') --idx;
  r.prompt = r.chosen.substr(0, idx);
  r.chosen = r.chosen.substr(idx);
  r.rejected = r.rejected.substr(idx);
}

// Messages: the prompt is the messages chosen and rejected share, as trl.extract_prompt takes it;
// where they differ before the assistant's answers (the first differing message is not the
// assistant's), their prompts differ: TRL would train on the rest of the conversation as the
// completion, trainer refuses the record.
void split_message_prompt(PreferenceRecord& r, const std::string& where) {
  const auto [end, differed] = implicit_prompt_end(r.chosen_m, r.rejected_m, same);
  if (differed) {
    for (const auto* side : {&r.chosen_m, &r.rejected_m}) {
      const auto& role = (*side)[end].role;
      if (role == "assistant") continue;
      throw RecordError{where + ": chosen and rejected differ at message " + std::to_string(end) +
                        " (a " + role +
                        " message), before the assistant's answers: without \"prompt\" the "
                        "prompt is the messages both start with; give them the same conversation "
                        "up to the answers (or set \"prompt\" and let each hold its answer)"};
    }
  }
  const auto at = static_cast<ptrdiff_t>(end);
  r.prompt_m.assign(r.chosen_m.begin(), r.chosen_m.begin() + at);
  r.chosen_m.erase(r.chosen_m.begin(), r.chosen_m.begin() + at);
  r.rejected_m.erase(r.rejected_m.begin(), r.rejected_m.begin() + at);
}

// A completion is the assistant's answer: it starts with an assistant message and holds only
// assistant and tool messages, with some content. `skipped`: the prompt's messages taken from it
// (an implicit prompt), for the index in the message.
void check_completion(const std::vector<ChatMessage>& messages, const char* key, size_t skipped,
                      const std::string& where) {
  if (messages.empty()) {
    throw RecordError{where + ": " + key +
                      " has no message after the prompt; each completion needs one"};
  }
  bool content = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& role = messages[i].role;
    content = content || !messages[i].content.empty() ||
              (messages[i].reasoning && !messages[i].reasoning->empty());
    if (role == "assistant" || (i > 0 && role == "tool")) continue;
    throw RecordError{
        where + ": " + key + "[" + std::to_string(skipped + i) + "] is a " + role +
        " message in the completion: roles out of order; a completion is the assistant's answer "
        "(assistant messages, tool results between them), the turns before it go in the prompt"};
  }
  if (!content) {
    throw RecordError{where + ": " + key +
                      " is empty (its messages have no content); each completion needs an answer"};
  }
}

PreferenceRecord parse_record(std::string_view line, const std::string& where) {
  Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    throw RecordError{where +
                      ": not a JSON object; a preference record is {\"prompt\", "
                      "\"chosen\", \"rejected\"} on one line"};
  }
  for (const char* key : {"chosen", "rejected"}) {
    if (!j.contains(key) || !(j[key].is_string() || j[key].is_array())) {
      throw RecordError{where + ": no \"" + key + "\" (text, or a list of messages)"};
    }
  }
  PreferenceRecord r;
  r.conversational = j["chosen"].is_array();
  const bool has_prompt = j.contains("prompt") && !j["prompt"].is_null();
  if (j["rejected"].is_array() != r.conversational ||
      (has_prompt && j["prompt"].is_array() != r.conversational)) {
    throw RecordError{where +
                      ": prompt, chosen and rejected mix text and lists of messages; "
                      "write all three as text or all as messages"};
  }
  if (!r.conversational) {
    if (has_prompt && !j["prompt"].is_string()) {
      throw RecordError{where + ": \"prompt\" must be text like chosen and rejected"};
    }
    r.chosen = j["chosen"].get<std::string>();
    r.rejected = j["rejected"].get<std::string>();
    for (const auto* key : {"chosen", "rejected"}) {
      if (j[key].get_ref<const std::string&>().empty()) {
        throw RecordError{where + ": \"" + key + "\" is empty; each completion needs text"};
      }
    }
    if (has_prompt) {
      r.prompt = j["prompt"].get<std::string>();
    } else {
      split_text_prompt(r);
    }
    return r;
  }
  r.chosen_m = messages_of(j["chosen"], where, "chosen");
  r.rejected_m = messages_of(j["rejected"], where, "rejected");
  if (has_prompt) {
    r.prompt_m = messages_of(j["prompt"], where, "prompt");
  } else {
    split_message_prompt(r, where);
  }
  const size_t skipped = has_prompt ? 0 : r.prompt_m.size();
  check_completion(r.chosen_m, "chosen", skipped, where);
  check_completion(r.rejected_m, "rejected", skipped, where);
  return r;
}

size_t common_prefix(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// What tokenizes the records: the tokenizer, its eos as text, and the chat format for messages.
struct RecordEncoder {
  const BpeTokenizer& tokenizer;
  std::optional<ChatFormat> format;  // none: the folder has no known template
  ChatSpecials specials;
  std::string eos;  // the eos token's text ("" without one)

  // tokenizer(text)["input_ids"]: the post-processor's bos, then the text's tokens.
  std::vector<int64_t> text_ids(const std::string& text) const {
    std::vector<int64_t> ids;
    if (tokenizer.added_bos_id() >= 0) ids.push_back(tokenizer.added_bos_id());
    const auto rest = tokenizer.encode(text);
    ids.insert(ids.end(), rest.begin(), rest.end());
    return ids;
  }

  // apply_chat_template(messages, tokenize=True[, add_generation_prompt=True]).
  std::vector<int64_t> chat_ids(const std::vector<ChatMessage>& messages, bool generation) const {
    const std::string text = generation ? render_generation_prompt(*format, messages, specials)
                                        : render_chat(*format, messages, specials).text;
    return tokenizer.encode(text);
  }
};

std::vector<int32_t> narrow_ids(const std::vector<int64_t>& ids, size_t from, size_t to) {
  return {ids.begin() + static_cast<ptrdiff_t>(from), ids.begin() + static_cast<ptrdiff_t>(to)};
}

// DPOTrainer._prepare_dataset's tokenize_fn, after add_eos for text records.
PreferenceTokens tokenize(const RecordEncoder& e, PreferenceRecord r, const std::string& where) {
  std::vector<int64_t> prompt, chosen, rejected;
  if (r.conversational) {
    if (!e.format) {
      throw DataConfigError("data.chat_template",
                            where +
                                ": a conversational record, and the tokenizer's folder has "
                                "no chat template trainer renders; set data.chat_template");
    }
    std::vector<ChatMessage> with = r.prompt_m;
    try {
      prompt = e.chat_ids(r.prompt_m, /*generation=*/true);
      with.insert(with.end(), r.chosen_m.begin(), r.chosen_m.end());
      chosen = e.chat_ids(with, false);
      with.resize(r.prompt_m.size());
      with.insert(with.end(), r.rejected_m.begin(), r.rejected_m.end());
      rejected = e.chat_ids(with, false);
    } catch (const ChatRenderError& err) {
      throw RecordError{where + ": " + err.what()};
    }
  } else {
    for (auto* text : {&r.chosen, &r.rejected}) {
      const bool ends = text->size() >= e.eos.size() &&
                        text->compare(text->size() - e.eos.size(), e.eos.size(), e.eos) == 0;
      if (!ends) *text += e.eos;
    }
    prompt = e.text_ids(r.prompt);
    chosen = e.text_ids(r.prompt + r.chosen);
    rejected = e.text_ids(r.prompt + r.rejected);
  }
  // The completion starts where the prompt's tokens and prompt + completion's diverge.
  const size_t n = std::min(common_prefix(prompt, chosen), common_prefix(prompt, rejected));
  return {narrow_ids(prompt, 0, n), narrow_ids(chosen, n, chosen.size()),
          narrow_ids(rejected, n, rejected.size())};
}

}  // namespace

PreferenceTokens tokenize_preference_line(std::string_view line, const std::string& where,
                                          const BpeTokenizer& tokenizer,
                                          std::optional<ChatFormat> format,
                                          const ChatSpecials& specials) {
  const int64_t eos = tokenizer.eos_id();
  const RecordEncoder e{tokenizer, format, specials, eos >= 0 ? tokenizer.token_bytes(eos) : ""};
  try {
    return tokenize(e, parse_record(line, where), where);
  } catch (const RecordError& err) {
    throw PreferenceRecordError(err.message);
  }
}

}  // namespace trainer::data
