// A chat record rendered in its format and tokenized as transformers' apply_chat_template does
// (the whole text at once, special tokens recognised), with the loss mask of data.train_on: which
// tokens are trained as targets. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/chat_records.h"
#include "data/chat_template.h"
#include "data/hf_tokenizer.h"

namespace trainer::data {

// Which tokens train (data.train_on), as torchtune and TRL define them. A token counts where its
// bytes overlap a trained part of the text (transformers' char_to_token convention); the first
// token of a conversation never does (nothing predicts it).
enum class TrainOn {
  assistant,   // every assistant turn: its text after the generation prompt, end-of-turn included
  all,         // every token
  last,        // the last assistant turn only
  completion,  // everything after the prompt's generation prompt ({"prompt", "completion"} only)
};
const std::vector<std::string>& train_on_names();  // assistant, all, last, completion
std::optional<TrainOn> train_on_named(const std::string& name);

struct EncodedChat {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // per token: 1 where it is a trained target
};

// Thrown when a tokenizer cannot encode a format (a special token it lacks), naming both.
class ChatEncodeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class ChatEncoder {
 public:
  // Checks that `tokenizer` has the format's special tokens (each encoding as one token) and, for
  // the Llama formats, a bos token; throws ChatEncodeError. `tokenizer` must outlive this.
  ChatEncoder(const BpeTokenizer& tokenizer, ChatFormat format, ChatSpecials specials,
              TrainOn train_on);

  // `record` rendered and tokenized. Throws ChatRenderError for a role the format does not
  // render, DataError when the tokens do not spell the rendered text back (a tokenizer whose
  // added tokens strip whitespace). Thread-safe with one `cache` per thread (null: none).
  EncodedChat encode(const ChatRecord& record, BpeTokenizer::PieceCache* cache) const;

  ChatFormat format() const { return format_; }
  TrainOn train_on() const { return train_on_; }

 private:
  // The byte ranges of the rendered text that train.
  std::vector<std::pair<size_t, size_t>> trained_spans(const ChatRecord& record,
                                                       const RenderedChat& chat) const;

  const BpeTokenizer& tokenizer_;
  ChatFormat format_;
  ChatSpecials specials_;
  TrainOn train_on_;
  bool normalizes_ = false;  // the tokenizer applies NFC
};

}  // namespace trainer::data
