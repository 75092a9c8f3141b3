// The records of chat data, one JSON object a line (JSONL):
//
//   {"messages": [{"role": "system", "content": "..."}, {"role": "user", ...}, ...]}
//   {"prompt": "...", "completion": "..."}                   (a user turn, then an assistant turn)
//   {"prompt": [messages...], "completion": [messages...]}   (conversational prompt and completion)
//
// Roles are system, user, assistant and tool; contents are strings; an assistant message may carry
// "reasoning_content" (a string, rendered by Qwen 3's template) and OpenAI-style "tool_calls"
// ([{"type": "function", "function": {"name", "arguments"}}], the arguments an object or a string;
// its content then may be null), and a record a list of "tools" (function schemas), rendered where
// the format's template renders them (chat_template.h). A null or empty tool_calls is none; a
// record's "chat_template_kwargs" (unless null or empty) is refused. Other keys are ignored.
// Torch-free.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/chat/chat_template.h"

namespace trainer::data {

struct ChatRecord {
  std::vector<ChatMessage> messages;  // empty: an empty conversation
  bool prompt_completion = false;     // a {"prompt", "completion"} record
  size_t completion_from = 0;         // the index of the completion's first message
  ChatTools tools;                    // the record's "tools"
};

// A line that is not a chat record: not JSON, not an object of the keys above, a content that is
// not a string. The message starts with `where` (FILE:LINE, and :COLUMN for JSON syntax).
class ChatRecordError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Whether `line` holds only whitespace (such lines are skipped).
bool blank_line(std::string_view line);

// Whether `text`, a whole file, is one JSON array (e.g. Alpaca's alpaca_data.json, pretty-printed):
// records written as JSON, not JSON Lines.
bool json_array_file(std::string_view text);

// The record of one JSONL line; `where` is "FILE:LINE". Throws ChatRecordError.
ChatRecord parse_chat_record(std::string_view line, const std::string& where);

// What a JSON value is, for messages: "null", "an object", "a list", "a string", "a boolean",
// "a number".
std::string json_type_name(const nlohmann::ordered_json& j);

// The path of message `i` of `record` in its JSON: messages[i], prompt[i] or completion[i].
std::string chat_message_path(const ChatRecord& record, size_t i);

// What a ChatRenderError of `record` says, after "FILE:LINE: ": the message's path and key
// ("messages[1].tool_calls", or the record's "\"tools\""), and why (for a role, with the hint to
// render other roles with scripts/render_chat.py).
std::string chat_render_error_text(const ChatRecord& record, const ChatRenderError& e);

}  // namespace trainer::data
