#include "text/chat/chat_records.h"

#include <nlohmann/json.hpp>

#include <string>
#include <utility>

#include "text/chat/python_json.h"
#include "util/json_error.h"

namespace trainer::data {
namespace {

using Json = nlohmann::ordered_json;  // keys in the order given, as tojson prints them

std::string type_name(const Json& j) {
  return json_type_name(j);
}

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw ChatRecordError(where + ": " + what);
}

// The JSON value of `line`; a syntax error names its column.
Json parse_json(std::string_view line, const std::string& where) {
  try {
    return Json::parse(line.begin(), line.end());
  } catch (const Json::exception& e) {  // a syntax error has a column; 1e999 (too large) none
    std::string line, column;           // the line is always 1: a JSONL line is one document
    const std::string why = json_error_text(e, &line, &column);
    throw ChatRecordError(where + (column.empty() ? "" : ":" + column) + ": not JSON: " + why);
  }
}

// Whether `j` holds something: not null, an empty list or an empty object.
bool given(const Json& j) {
  return !j.is_null() && !((j.is_array() || j.is_object()) && j.empty());
}

// One of a message's tool_calls: {"type": "function", "function": {"name", "arguments"}}, the
// arguments an object or a string (as transformers takes them; the templates print both).
ChatToolCall read_tool_call(const Json& call, const std::string& where, const std::string& path) {
  const std::string form =
      " (OpenAI's {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}})";
  if (!call.is_object())
    fail(where, path + " must be an object" + form + ", got " + type_name(call));
  const auto function = call.find("function");
  if (function == call.end() || !function->is_object()) {
    fail(where, path + ".function must be an object {\"name\", \"arguments\"}" + form);
  }
  const auto name = function->find("name");
  if (name == function->end() || !name->is_string()) {
    fail(where, path + ".function.name must be a string");
  }
  const auto arguments = function->find("arguments");
  if (arguments == function->end() || !(arguments->is_object() || arguments->is_string())) {
    fail(where, path + ".function.arguments must be an object or a string of JSON, got " +
                    (arguments == function->end() ? std::string("none") : type_name(*arguments)));
  }
  ChatToolCall out;
  out.name = name->get<std::string>();
  out.arguments_string = arguments->is_string();
  out.arguments =
      out.arguments_string ? arguments->get<std::string>() : python_json_dumps(*arguments);
  return out;
}

// A message's tool_calls; null or [] is none.
std::vector<ChatToolCall> read_tool_calls(const Json& m, const std::string& where,
                                          const std::string& path) {
  const auto calls = m.find("tool_calls");
  if (calls == m.end() || !given(*calls)) return {};
  if (!calls->is_array()) {
    fail(where, path + ".tool_calls must be a list of calls, got " + type_name(*calls));
  }
  const auto role = m.find("role");
  if (role != m.end() && *role != "assistant") {
    fail(where, path + " has tool_calls: only an assistant message calls tools");
  }
  std::vector<ChatToolCall> out;
  for (size_t i = 0; i < calls->size(); ++i) {
    out.push_back(
        read_tool_call((*calls)[i], where, path + ".tool_calls[" + std::to_string(i) + "]"));
  }
  return out;
}

// A record's "tools": tool definitions (OpenAI function schemas), which the templates print into
// the system or the first user turn as tojson writes them.
ChatTools read_tools(const Json& record, const std::string& where) {
  const auto tools = record.find("tools");
  if (tools == record.end() || tools->is_null()) return std::nullopt;
  if (!tools->is_array()) {
    fail(where,
         "\"tools\" must be a list of tool definitions ({\"type\": \"function\", "
         "\"function\": {\"name\", \"description\", \"parameters\"}}), got " +
             type_name(*tools));
  }
  std::vector<ChatTool> out;
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    if (!t.is_object()) {
      fail(where, "tools[" + std::to_string(i) + "] must be an object (a function schema), got " +
                      type_name(t));
    }
    out.push_back({python_json_dumps(t), python_json_dumps(t, 4)});
  }
  return out;
}

// A record's "chat_template_kwargs" (arguments to the template, as TRL passes them).
void refuse_template_arguments(const Json& record, const std::string& where) {
  const auto kwargs = record.find("chat_template_kwargs");
  if (kwargs != record.end() && given(*kwargs)) {
    fail(where,
         "\"chat_template_kwargs\": arguments to the chat template are not supported (the "
         "built-in templates render as the template does with none given); remove the key");
  }
}

ChatMessage read_message(const Json& m, const std::string& where, const std::string& path) {
  if (!m.is_object()) fail(where, path + " must be an object {\"role\", \"content\"}");
  const auto role = m.find("role");
  const auto content = m.find("content");
  if (role == m.end() || !role->is_string()) {
    fail(where, path + ".role must be a string (system, user, assistant or tool)");
  }
  std::vector<ChatToolCall> calls = read_tool_calls(m, where, path);
  const bool none = content == m.end() || content->is_null();
  if (!(content != m.end() && content->is_string()) && !(none && !calls.empty())) {
    fail(where, path + ".content must be a string" + (calls.empty() ? "" : " or null") + ", got " +
                    (content == m.end() ? std::string("none") : type_name(*content)) +
                    " (the built-in chat templates render text only)");
  }
  ChatMessage out{role->get<std::string>(), none ? "" : content->get<std::string>(), std::nullopt,
                  std::move(calls)};
  const auto reasoning = m.find("reasoning_content");
  if (reasoning != m.end() && !reasoning->is_null()) {
    if (!reasoning->is_string()) fail(where, path + ".reasoning_content must be a string");
    out.reasoning = reasoning->get<std::string>();
  }
  return out;
}

void read_messages(const Json& list, const std::string& where, const std::string& key,
                   std::vector<ChatMessage>& out) {
  if (!list.is_array()) {
    fail(where, "\"" + key + "\" must be a list of {\"role\", \"content\"} messages, got " +
                    type_name(list));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    out.push_back(read_message(list[i], where, key + "[" + std::to_string(i) + "]"));
  }
}

// A prompt or a completion: a string (one `role` message) or a list of messages.
void read_part(const Json& part, const std::string& where, const std::string& key,
               const std::string& role, std::vector<ChatMessage>& out) {
  if (part.is_string()) {
    out.push_back({role, part.get<std::string>(), std::nullopt});
  } else if (part.is_array()) {
    read_messages(part, where, key, out);
  } else {
    fail(where, "\"" + key + "\" must be a string or a list of messages, got " + type_name(part));
  }
}

ChatRecord read_prompt_completion(const Json& record, const std::string& where) {
  const auto completion = record.find("completion");
  if (completion == record.end()) fail(where, "a \"prompt\" needs a \"completion\"");
  ChatRecord out;
  out.prompt_completion = true;
  read_part(record["prompt"], where, "prompt", "user", out.messages);
  out.completion_from = out.messages.size();
  read_part(*completion, where, "completion", "assistant", out.messages);
  if (out.messages.size() == out.completion_from) fail(where, "\"completion\" has no message");
  if (out.messages[out.completion_from].role != "assistant") {
    fail(where, "completion[0].role must be assistant, got \"" +
                    out.messages[out.completion_from].role + "\"");
  }
  return out;
}

}  // namespace

bool blank_line(std::string_view line) {
  for (const char c : line) {
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') return false;
  }
  return true;
}

bool json_array_file(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  return first != std::string_view::npos && text[first] == '[' &&
         Json::accept(text.begin(), text.end());
}

ChatRecord parse_chat_record(std::string_view line, const std::string& where) {
  const Json record = parse_json(line, where);
  if (!record.is_object()) {
    fail(where,
         "a record must be a JSON object with \"messages\", or \"prompt\" and "
         "\"completion\"; got " +
             type_name(record));
  }
  const bool messages = record.contains("messages");
  const bool prompt = record.contains("prompt");
  if (messages && prompt) fail(where, "a record has \"messages\" or \"prompt\", not both");
  refuse_template_arguments(record, where);
  if (prompt) {
    ChatRecord out = read_prompt_completion(record, where);
    out.tools = read_tools(record, where);
    return out;
  }
  if (!messages) {
    if (record.contains("conversations")) {
      fail(where,
           "a ShareGPT record (\"conversations\" of {from, value}); write "
           "{\"messages\": [{\"role\", \"content\"}, ...]} (human: user, gpt: assistant)");
    }
    fail(where,
         "a record needs \"messages\" (a list of {\"role\", \"content\"}), or \"prompt\" "
         "and \"completion\"");
  }
  ChatRecord out;
  read_messages(record["messages"], where, "messages", out.messages);
  out.tools = read_tools(record, where);
  return out;
}

std::string chat_message_path(const ChatRecord& record, size_t i) {
  if (!record.prompt_completion) return "messages[" + std::to_string(i) + "]";
  return i < record.completion_from
             ? "prompt[" + std::to_string(i) + "]"
             : "completion[" + std::to_string(i - record.completion_from) + "]";
}

std::string chat_render_error_text(const ChatRecord& record, const ChatRenderError& e) {
  if (e.message() == ChatRenderError::kRecord) return "\"" + e.field() + "\": " + e.what();
  std::string text = chat_message_path(record, e.message()) + "." + e.field() + ": " + e.what();
  if (e.field() == "role") text += "; render other roles with scripts/render_chat.py";
  return text;
}

std::string json_type_name(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return "null";
    case nlohmann::ordered_json::value_t::object:
      return "an object";
    case nlohmann::ordered_json::value_t::array:
      return "a list";
    case nlohmann::ordered_json::value_t::string:
      return "a string";
    case nlohmann::ordered_json::value_t::boolean:
      return "a boolean";
    default:
      return "a number";
  }
}

}  // namespace trainer::data
