// A chat record rendered in its format and tokenized as transformers' apply_chat_template does
// (the whole text at once, special tokens recognised), with the loss mask of data.train_on: which
// tokens are trained as targets. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "text/chat/chat_records.h"
#include "text/chat/chat_template.h"
#include "text/tokenizer/hf_tokenizer.h"

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

// The chat format of the tokenizer in `folder`, as data.chat_template says: a name of
// chat_format_names(), or "auto" for the published template recognised in the folder's
// chat_template.jinja, else its tokenizer_config.json's chat_template (logged). Throws
// DataConfigError naming data.chat_template when the folder has no template or another one,
// DataError for a tokenizer_config.json that is not JSON.
ChatFormat pick_chat_format(const std::string& chat_template, const std::string& folder);

// The format pick_chat_format picks, without logging; nullopt where it would throw.
std::optional<ChatFormat> find_chat_format(const std::string& chat_template,
                                           const std::string& folder);

// What `format` renders with `tokenizer` besides the messages: its bos (plain: the bos its
// post-processor adds), its eos, and `date` (data.chat_date) as Llama 3.1 and 3.2's date.
ChatSpecials chat_specials(const BpeTokenizer& tokenizer, ChatFormat format,
                           const std::string& date);

class ChatEncoder {
 public:
  // Checks that `tokenizer` has the format's special tokens (each encoding as one token) and, for
  // the Llama formats, a bos token; throws ChatEncodeError. `tokenizer` must outlive this.
  ChatEncoder(const BpeTokenizer& tokenizer, ChatFormat format, ChatSpecials specials,
              TrainOn train_on);

  // `record` rendered and tokenized. Throws ChatRenderError for what the format does not render
  // (a role, tool calls, tools: chat_render_error_text says it), DataError when the tokens do not
  // spell the rendered text back (a tokenizer whose added tokens strip whitespace). Thread-safe
  // with one `cache` per thread (null: none).
  EncodedChat encode(const ChatRecord& record, BpeTokenizer::PieceCache* cache) const;

  // The ids of `messages` rendered with add_generation_prompt=True (render_generation_prompt),
  // as apply_chat_template(messages, add_generation_prompt=True, tokenize=True) gives them.
  // Throws ChatRenderError for a role the format does not render.
  std::vector<int64_t> generation_prompt(const std::vector<ChatMessage>& messages) const;

  // The id of the token that ends an assistant turn (chat_end_of_turn); -1 when the format has
  // none (plain with a tokenizer without eos).
  int64_t end_of_turn_id() const;

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
