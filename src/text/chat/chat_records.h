// The records of chat data, one JSON object a line (JSONL):
//
//   {"messages": [{"role": "system", "content": "..."}, {"role": "user", ...}, ...]}
//   {"prompt": "...", "completion": "..."}                   (a user turn, then an assistant turn)
//   {"prompt": [messages...], "completion": [messages...]}   (conversational prompt and completion)
//
// Roles are system, user and assistant; contents are strings; an assistant message may carry
// "reasoning_content" (a string, rendered by Qwen 3's template). What the templates would render
// and the built-in ones do not is refused: a message's "tool_calls" (unless null or empty), a
// record's "tools" (unless null) and "chat_template_kwargs" (unless null or empty). Other keys are
// ignored.
// Torch-free.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat/chat_template.h"

namespace trainer::data {

struct ChatRecord {
  std::vector<ChatMessage> messages;  // empty: an empty conversation
  bool prompt_completion = false;     // a {"prompt", "completion"} record
  size_t completion_from = 0;         // the index of the completion's first message
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

}  // namespace trainer::data
