#include "data/chat_encode.h"

#include <algorithm>
#include <array>
#include <string_view>
#include <utility>

#include "data/dataset.h"
#include "util/unicode_nfc.h"

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

}  // namespace

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
  if (llama(format) && specials_.bos.empty()) {
    throw ChatEncodeError(tokenizer.source() + " names no bos_token (tokenizer_config.json); the " +
                          name + " chat format starts with it");
  }
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

EncodedChat ChatEncoder::encode(const ChatRecord& record, BpeTokenizer::PieceCache* cache) const {
  const RenderedChat chat = render_chat(format_, record.messages, specials_);
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
