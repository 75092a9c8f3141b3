// Chat templates rendered by built-in code: the published templates of Llama 3, 3.1 and 3.2
// Instruct and of ChatML (Qwen 2, 2.5, 3), recognised by the exact text of tokenizer_config.json's
// `chat_template`, rendered as transformers' apply_chat_template renders them, with where each
// assistant turn lies in the text. Conversations of system, user and assistant messages in every
// format; in the formats whose templates render tools (Llama 3.1 and 3.2, Qwen 2.5 and 3), also
// assistant messages with OpenAI-style tool calls, tool messages and a list of tool definitions,
// as apply_chat_template(messages, tools=tools) renders them. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
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

// A call of an assistant message's tool_calls: {"type": "function", "function": {"name",
// "arguments"}}.
struct ChatToolCall {
  std::string name;
  // The arguments: an object as the templates' tojson writes it (python_json_dumps), or the string
  // given (which Qwen 3 prints as it is, and the others as a quoted JSON string).
  std::string arguments;
  bool arguments_string = false;  // given as a string
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role, std::string content,
              std::optional<std::string> reasoning = std::nullopt,
              std::vector<ChatToolCall> tool_calls = {})
      : role(std::move(role)),
        content(std::move(content)),
        reasoning(std::move(reasoning)),
        tool_calls(std::move(tool_calls)) {}

  std::string role;     // system, user, assistant or tool
  std::string content;  // an assistant message with tool calls: "" for a null content
  std::optional<std::string> reasoning;  // the message's reasoning_content (Qwen 3), if given
  std::vector<ChatToolCall> tool_calls;  // an assistant message's; empty: none
};

// A tool definition of a record's "tools" (an OpenAI function schema, any JSON object) as the
// templates' tojson writes it: on one line (Qwen) and with indent=4 (Llama).
struct ChatTool {
  std::string json;
  std::string json_indented;
};
// A record's "tools": nullopt for none (no key, or null); an empty list renders as an empty list
// does (Llama 3.1 and 3.2: the tool preamble without definitions; Qwen: nothing).
using ChatTools = std::optional<std::vector<ChatTool>>;

// Whether `format`'s template renders tool calls, tool messages and tool definitions.
bool chat_format_renders_tools(ChatFormat format);

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

// Thrown for what the format does not render: a role other than system, user, assistant (and
// tool where it renders tools), a message's tool calls or a record's tools in a format without
// them, what the template itself raises on (Llama 3.1 and 3.2: more than one call a message,
// tools without a user message after the system one). `message` is the message's index, or
// kRecord for the record's "tools"; `field` the key at fault ("role", "tool_calls", "tools").
class ChatRenderError : public std::invalid_argument {
 public:
  static constexpr size_t kRecord = static_cast<size_t>(-1);
  ChatRenderError(size_t message, const std::string& what, std::string field = "role")
      : std::invalid_argument(what), message_(message), field_(std::move(field)) {}
  size_t message() const { return message_; }
  const std::string& field() const { return field_; }

 private:
  size_t message_;
  std::string field_;
};

// `messages` (and `tools`) rendered in `format` (add_generation_prompt=False). Throws
// ChatRenderError.
RenderedChat render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                         const ChatSpecials& specials, const ChatTools& tools = std::nullopt);

// `messages` rendered in `format` with add_generation_prompt=True: the text an assistant reply to
// them is generated after (the render of `messages` and an assistant turn, up to where the turn's
// body begins). Throws ChatRenderError.
std::string render_generation_prompt(ChatFormat format, const std::vector<ChatMessage>& messages,
                                     const ChatSpecials& specials,
                                     const ChatTools& tools = std::nullopt);

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
