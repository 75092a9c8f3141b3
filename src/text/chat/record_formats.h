// The record formats chat data sets are published in, each record rewritten into the OpenAI form
// the chat parser reads (text/chat/chat_records.h), as LLaMA-Factory's converters
// (src/llamafactory/data/converter.py) and its data/README.md define them:
//
//   messages           {"messages": [{"role", "content", ...}, ...]}        (as it is)
//   prompt_completion  {"prompt", "completion"}                              (as it is)
//   alpaca             {"instruction", "input", "output", "system", "history": [[user, assistant]]}
//       -> {"prompt": [system, history turns..., user], "completion": [assistant]}: the user turn
//          is instruction and input joined by "\n" (each only where non-empty), the system message
//          only where system is a non-empty string.
//   sharegpt           {"conversations": [{"from", "value"}, ...], "system", "tools"}
//       -> {"messages": [...]}: human -> user, gpt -> assistant, system -> system (a first system
//          message, else a non-empty record-level "system", becomes the first message),
//          function_call -> an assistant message with OpenAI tool_calls (the value is JSON
//          {"name", "arguments"} or a list of them), observation -> a "tool" message.
//
// A record-level "tools" of alpaca and sharegpt records (a list of function definitions, or its
// JSON text as LLaMA-Factory stores it) becomes the record's OpenAI "tools", each definition
// without a "type" wrapped as {"type": "function", "function": definition}; "" and [] are none.
// Column and role names other than these are set by RecordMapping (data.messages_key,
// data.user_role, ... of the chat data set), as LLaMA-Factory's dataset_info "columns" and "tags".
// Unlike LLaMA-Factory, roles need not alternate: the messages go to the template as they are.
// Format auto takes a record's format from its keys, the first that holds: "messages"; "prompt" and
// "completion"; "conversations"; the instruction column; "prompt".
// Torch-free.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trainer::data {

enum class RecordFormat { automatic, messages, alpaca, sharegpt, prompt_completion };

// "auto", "messages", "alpaca", "sharegpt", "prompt_completion", in the enum's order.
const std::vector<std::string>& record_format_names();
std::optional<RecordFormat> record_format_named(const std::string& name);

// The columns and role names of a data set's records; "" is the format's own name. A role's
// names are a comma-separated list ("human,user").
struct RecordMapping {
  RecordFormat format = RecordFormat::automatic;
  std::string messages_key;     // the message list: messages (messages), conversations (sharegpt)
  std::string role_key;         // a message's role: role (messages), from (sharegpt)
  std::string content_key;      // a message's content: content (messages), value (sharegpt)
  std::string system_key;       // the record's system prompt: system (alpaca, sharegpt); for
                                // messages read only where set
  std::string instruction_key;  // alpaca: instruction
  std::string input_key;        // alpaca: input
  std::string output_key;       // alpaca: output
  std::string history_key;      // alpaca: history
  std::string user_role;        // user (messages), human (sharegpt)
  std::string assistant_role;   // assistant (messages), gpt (sharegpt)
  std::string system_role;      // system
  std::string tool_role;        // a tool's result: tool (messages), observation (sharegpt)
  std::string tool_call_role;   // a tool call, its content JSON {"name", "arguments"}: none
                                // (messages, whose assistant messages carry tool_calls),
                                // function_call (sharegpt)
};

// The problems of a mapping's settings, as (key without "data.", message): a role name given to
// two roles, an empty name in a list, data.messages_key with format auto (which recognises the
// list by its name).
std::vector<std::pair<std::string, std::string>> record_mapping_problems(const RecordMapping& m);

// The record of the JSONL line `line` in the chat parser's form, or nullopt where the line is to
// be parsed as it is: a messages or prompt/completion record under its own names, or a line that
// is not a JSON object (which the parser reports). `where` is "FILE:LINE". Throws ChatRecordError
// (text/chat/chat_records.h) whose message starts with `where`: a record of no format (format
// auto: naming its keys and the formats' keys), a column the format needs missing or of another
// type, a role name that is none of the format's.
std::optional<std::string> normalize_chat_line(std::string_view line, const RecordMapping& m,
                                               const std::string& where);

}  // namespace trainer::data
