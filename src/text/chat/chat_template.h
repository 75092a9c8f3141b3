// Chat templates rendered by built-in code: the published templates of Llama 3, 3.1 and 3.2
// Instruct and of ChatML (Qwen 2, 2.5, 3), recognised by the exact text of tokenizer_config.json's
// `chat_template`, rendered as transformers' apply_chat_template renders them for conversations
// of system, user and assistant messages (no tools), with where each assistant turn lies in the
// text. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace trainer::data {

// The conversation formats rendered here.
enum class ChatFormat {
  llama3,   // Meta-Llama-3-*-Instruct: <|begin_of_text|>, a header per message, content trimmed
  llama31,  // Llama-3.1/3.3-*-Instruct: a system header dated "26 Jul 2024" before the messages
  llama32,  // Llama-3.2-*-Instruct: the same, dated today (transformers' strftime_now)
  chatml,   // <|im_start|>role\ncontent<|im_end|>\n per message, nothing else
  qwen2,    // Qwen2-*-Instruct: ChatML with "You are a helpful assistant." when no system message
  qwen25,   // Qwen2.5-*-Instruct: ChatML with "You are Qwen, created by Alibaba Cloud. ..." then
  qwen3,    // Qwen3: ChatML; an assistant turn after the last user message gets a <think> block
  plain,    // no template: the contents one after another, eos after each assistant message
};

// The names data.chat_template takes for the formats: llama3, llama3.1, llama3.2, chatml, qwen2,
// qwen2.5, qwen3, plain.
const std::vector<std::string>& chat_format_names();
std::string chat_format_name(ChatFormat format);
std::optional<ChatFormat> chat_format_named(const std::string& name);

// The format of a published chat template, by its exact text (one trailing newline aside, which
// Jinja drops); nullopt for any other text.
std::optional<ChatFormat> recognize_chat_template(std::string_view text);

// The 64-bit FNV-1a hash of `text` without one trailing newline: what recognize_chat_template
// compares.
uint64_t chat_template_hash(std::string_view text);

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
  std::optional<std::string> reasoning;  // the message's reasoning_content (Qwen 3), if given
};

// What a format renders besides the messages.
struct ChatSpecials {
  std::string bos;   // the tokenizer's beginning-of-text token as text (Llama 3's bos_token; the
                     // token plain puts first); "" for none
  std::string eos;   // the end-of-sequence token as text (plain puts it after assistant turns)
  std::string date;  // Llama 3.1 and 3.2's "Today Date"; "" for the template's own default
};

// A rendered conversation.
struct RenderedChat {
  std::string text;
  // For each assistant message, in order: its index among the messages and the bytes
  // [begin, end) of the text it adds after the generation prompt the turns before it end with
  // (the render of the turns before it with add_generation_prompt=True), up to and including its
  // end-of-turn tokens (ChatML's newline after <|im_end|> too).
  struct Turn {
    size_t message = 0;
    size_t begin = 0, end = 0;
  };
  std::vector<Turn> turns;
};

// Thrown for a message the format does not render (a role other than system, user, assistant);
// `message` is its index.
class ChatRenderError : public std::invalid_argument {
 public:
  ChatRenderError(size_t message, const std::string& what)
      : std::invalid_argument(what), message_(message) {}
  size_t message() const { return message_; }

 private:
  size_t message_;
};

// `messages` rendered in `format` (add_generation_prompt=False). Throws ChatRenderError.
RenderedChat render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                         const ChatSpecials& specials);

// `messages` rendered in `format` with add_generation_prompt=True: the text an assistant reply to
// them is generated after (the render of `messages` and an assistant turn, up to where the turn's
// body begins). Throws ChatRenderError.
std::string render_generation_prompt(ChatFormat format, const std::vector<ChatMessage>& messages,
                                     const ChatSpecials& specials);

// The text that ends an assistant turn in `format`: Llama 3's <|eot_id|>, ChatML's <|im_end|>,
// plain's specials.eos.
std::string chat_end_of_turn(ChatFormat format, const ChatSpecials& specials);

// The text each format requires as special tokens of the tokenizer (e.g. <|im_start|>).
std::vector<std::string> chat_format_tokens(ChatFormat format);

// Whether the format's default date is today's (Llama 3.2 with no ChatSpecials::date).
bool chat_format_dated_today(ChatFormat format);

// Today's date as strftime's "%d %b %Y" in the C locale and the local time zone ("06 Dec 2026"),
// as transformers' strftime_now renders it for Llama 3.2.
std::string chat_today();

// Python's str.strip(): `text` without leading and trailing Unicode whitespace (what Jinja's trim
// filter removes).
std::string python_strip(std::string_view text);

}  // namespace trainer::data
