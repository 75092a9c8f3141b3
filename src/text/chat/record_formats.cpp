#include "text/chat/record_formats.h"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <utility>

#include "text/chat/chat_records.h"

namespace trainer::data {
namespace {

using Json = nlohmann::ordered_json;  // keys in their order: templates print tools with tojson

// The roles a message may map to; tool_call is an assistant message with tool_calls.
constexpr const char* kRoles[] = {"user", "assistant", "system", "tool", "tool_call"};

std::string type_name(const Json& j) {
  return json_type_name(j);
}

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw ChatRecordError(where + ": " + what);
}

std::string quote(const std::string& s) {
  return "\"" + s + "\"";
}

// `j` as JSON, cut to 60 characters.
std::string excerpt(const Json& j) {
  const std::string text = j.dump();
  return text.size() <= 60 ? text : text.substr(0, 57) + "...";
}

// "\"a\", \"b\"" for an object's keys (the first 8, then a count); "none" for none.
std::string keys_of(const Json& object) {
  std::string out;
  size_t n = 0;
  for (auto it = object.begin(); it != object.end(); ++it, ++n) {
    if (n == 8) return out + " and " + std::to_string(object.size() - 8) + " more";
    out += (n ? ", " : "") + quote(it.key());
  }
  return n ? out : "none";
}

// The names of a comma-separated list, spaces at their edges dropped.
std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= list.size()) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(at, end - at);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    out.push_back(name);
    at = end + 1;
  }
  return out;
}

const std::string* role_setting(const RecordMapping& m, size_t role) {
  const std::string* settings[] = {&m.user_role, &m.assistant_role, &m.system_role, &m.tool_role,
                                   &m.tool_call_role};
  return settings[role];
}

const char* role_key(size_t role) {
  static const char* keys[] = {"user_role", "assistant_role", "system_role", "tool_role",
                               "tool_call_role"};
  return keys[role];
}

// The names of one format's records.
struct Names {
  RecordFormat format = RecordFormat::automatic;
  std::string messages, role, content, system, instruction, input, output, history;
  // Whether a record-level system prompt is read.
  bool read_system = true;
  // Role name -> index into kRoles, the names data.*_role set first.
  std::vector<std::pair<std::string, size_t>> tags;
};

std::string pick(const std::string& set, const char* own) {
  return set.empty() ? own : set;
}

Names names_for(const RecordMapping& m, RecordFormat f) {
  const bool share = f == RecordFormat::sharegpt;
  Names n;
  n.format = f;
  n.messages = pick(m.messages_key, share ? "conversations" : "messages");
  n.role = pick(m.role_key, share ? "from" : "role");
  n.content = pick(m.content_key, share ? "value" : "content");
  n.system = pick(m.system_key, "system");
  n.read_system = f != RecordFormat::messages || !m.system_key.empty();
  n.instruction = pick(m.instruction_key, "instruction");
  n.input = pick(m.input_key, "input");
  n.output = pick(m.output_key, "output");
  n.history = pick(m.history_key, "history");
  const char* own_share[] = {"human", "gpt", "system", "observation", "function_call"};
  const char* own_messages[] = {"user", "assistant", "system", "tool", nullptr};
  for (size_t r = 0; r < 5; ++r) {
    if (role_setting(m, r)->empty()) continue;
    for (const auto& name : split_names(*role_setting(m, r))) n.tags.emplace_back(name, r);
  }
  for (size_t r = 0; r < 5; ++r) {
    const char* own = share ? own_share[r] : own_messages[r];
    if (own && role_setting(m, r)->empty()) n.tags.emplace_back(own, r);
  }
  return n;
}

// Whether a messages record is read as it is (no name set that it would be read with).
bool messages_as_they_are(const RecordMapping& m) {
  for (size_t r = 0; r < 5; ++r) {
    if (!role_setting(m, r)->empty()) return false;
  }
  return m.messages_key.empty() && m.role_key.empty() && m.content_key.empty() &&
         m.system_key.empty();
}

// A string column that may be missing or null (nullopt); another type fails.
std::optional<std::string> optional_string(const Json& record, const std::string& key,
                                           const std::string& where, const std::string& setting) {
  const auto it = record.find(key);
  if (it == record.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) {
    fail(where, quote(key) + " must be a string, got " + type_name(*it) + " (" + setting + ")");
  }
  return it->get<std::string>();
}

// A record-level "tools": OpenAI's list of {"type": "function", "function": {...}}.
void add_tools(const Json& record, Json& out, const std::string& where) {
  const auto it = record.find("tools");
  if (it == record.end() || it->is_null()) return;
  Json tools = *it;
  if (tools.is_string()) {
    const auto& text = it->get_ref<const std::string&>();
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) return;
    tools = Json::parse(text, nullptr, false);
    if (tools.is_discarded()) {
      fail(where,
           "\"tools\" is a string that is not JSON; write the list of function "
           "definitions, or its JSON text");
    }
  }
  if (tools.is_object()) tools = Json::array({tools});
  if (!tools.is_array()) fail(where, "\"tools\" must be a list of function definitions");
  if (tools.empty()) return;
  for (auto& t : tools) {
    if (!t.is_object()) fail(where, "\"tools\" must be a list of objects (function definitions)");
    if (!t.contains("type")) t = Json{{"type", "function"}, {"function", t}};
  }
  out["tools"] = std::move(tools);
}

// The tool_calls of a tool call message's content: JSON {"name", "arguments"} or a list of them.
Json tool_calls_of(const Json& content, const std::string& where, const std::string& path) {
  Json calls = content;
  if (content.is_string()) calls = Json::parse(content.get<std::string>(), nullptr, false);
  if (calls.is_object()) calls = Json::array({calls});
  const std::string form = " must be a tool call, JSON {\"name\", \"arguments\"} or a list of them";
  if (!calls.is_array() || calls.empty()) fail(where, path + form);
  Json out = Json::array();
  for (const auto& c : calls) {
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) fail(where, path + form);
    const auto args = c.find("arguments");
    out.push_back(
        {{"type", "function"},
         {"function",
          {{"name", c["name"]}, {"arguments", args == c.end() ? Json::object() : *args}}}});
  }
  return out;
}

// The role names a format reads, for a message naming them: "human (user), gpt (assistant)".
std::string tag_list(const Names& n) {
  std::string out;
  for (const auto& [name, role] : n.tags) {
    out += (out.empty() ? "" : ", ") + name + " (" +
           (role == 4 ? std::string("a tool call") : kRoles[role]) + ")";
  }
  return out;
}

// The role index of message `item`'s role name; nullopt for a name the format does not read.
std::optional<size_t> role_of(const Json& item, const Names& n, const std::string& where,
                              const std::string& path) {
  const auto it = item.find(n.role);
  if (it == item.end()) {
    const bool openai = n.format == RecordFormat::sharegpt && item.contains("role");
    fail(where, path + " has no " + quote(n.role) + " (data.role_key); its keys: " + keys_of(item) +
                    (openai ? "; for OpenAI messages under this name set data.format: messages "
                              "and data.messages_key: " +
                                  n.messages
                            : std::string()));
  }
  if (!it->is_string()) {
    fail(where, path + "." + n.role + " must be a string, got " + type_name(*it));
  }
  for (const auto& [name, role] : n.tags) {
    if (*it == name) return role;
  }
  if (n.format == RecordFormat::sharegpt) {
    fail(where, path + "." + n.role + " is " + quote(it->get<std::string>()) +
                    ", not a role of the records: " + tag_list(n) +
                    "; name it with data.user_role, data.assistant_role, data.system_role, "
                    "data.tool_role or data.tool_call_role");
  }
  return std::nullopt;
}

// Message `i` of the list in the parser's form.
Json convert_message(const Json& item, const Names& n, const std::string& where, size_t i) {
  const std::string path = n.messages + "[" + std::to_string(i) + "]";
  const bool share = n.format == RecordFormat::sharegpt;
  if (!item.is_object()) {
    fail(where, path + " must be an object {" + quote(n.role) + ", " + quote(n.content) +
                    "}, got " + type_name(item));
  }
  const auto role = role_of(item, n, where, path);
  const auto content = item.find(n.content);
  if (share && (content == item.end() || (!content->is_string() && role != 4u))) {
    fail(where, path + "." + n.content + " must be a string, got " +
                    (content == item.end() ? std::string("none") : type_name(*content)) +
                    " (data.content_key names the content)");
  }
  Json out = Json::object();
  if (!share) {  // other keys of a message (tool_calls, reasoning_content) go with it
    for (auto it = item.begin(); it != item.end(); ++it) {
      if (it.key() != n.role && it.key() != n.content) out[it.key()] = it.value();
    }
  }
  if (role == 4u) {
    out["role"] = "assistant";
    out["content"] = "";
    out["tool_calls"] =
        tool_calls_of(content == item.end() ? Json() : *content, where, path + "." + n.content);
    return out;
  }
  out["role"] = role ? std::string(kRoles[*role]) : item[n.role].get<std::string>();
  if (content != item.end()) out["content"] = *content;
  return out;
}

// A messages or ShareGPT record as {"messages": [...]}.
Json convert_list(const Json& record, const Names& n, const std::string& where) {
  const Json& list = record[n.messages];
  if (!list.is_array()) {
    fail(where, quote(n.messages) + " must be a list of messages, got " + type_name(list));
  }
  const bool share = n.format == RecordFormat::sharegpt;
  size_t from = 0;
  std::optional<std::string> system;
  if (!list.empty() && list[0].is_object() &&
      role_of(list[0], n, where, n.messages + "[0]") == 2u) {
    if (share) {  // LLaMA-Factory's: the first system message is the system prompt
      const auto c = list[0].find(n.content);
      if (c == list[0].end() || !c->is_string()) {
        fail(where, n.messages + "[0]." + n.content + " must be a string");
      }
      system = c->get<std::string>();
      from = 1;
    }
  } else if (n.read_system) {
    system = optional_string(record, n.system, where, "data.system_key names the system prompt");
  }
  Json out = Json::object();
  if (!share) {  // the record's other keys (tools, chat_template_kwargs) go with it
    for (auto it = record.begin(); it != record.end(); ++it) {
      if (it.key() != n.messages && !(n.read_system && it.key() == n.system)) {
        out[it.key()] = it.value();
      }
    }
  }
  Json messages = Json::array();
  if (system && !system->empty()) messages.push_back({{"role", "system"}, {"content", *system}});
  for (size_t i = from; i < list.size(); ++i) {
    messages.push_back(convert_message(list[i], n, where, i));
  }
  out["messages"] = std::move(messages);
  if (share) add_tools(record, out, where);
  return out;
}

// An Alpaca record as {"prompt": [system, history..., user], "completion": [assistant]}.
Json convert_alpaca(const Json& record, const Names& n, const std::string& where) {
  Json prompt = Json::array();
  const auto system =
      optional_string(record, n.system, where, "data.system_key names the system prompt");
  if (system && !system->empty()) prompt.push_back({{"role", "system"}, {"content", *system}});
  const auto history = record.find(n.history);
  if (history != record.end() && !history->is_null()) {
    if (!history->is_array()) {
      fail(where, quote(n.history) + " must be a list of [user, assistant] pairs, got " +
                      type_name(*history) + " (data.history_key names it)");
    }
    for (size_t i = 0; i < history->size(); ++i) {
      const Json& turn = (*history)[i];
      if (!turn.is_array() || turn.size() != 2 || !turn[0].is_string() || !turn[1].is_string()) {
        fail(where, n.history + "[" + std::to_string(i) +
                        "] must be a pair [user, assistant] of strings, got " + excerpt(turn));
      }
      prompt.push_back({{"role", "user"}, {"content", turn[0]}});
      prompt.push_back({{"role", "assistant"}, {"content", turn[1]}});
    }
  }
  std::string user;
  for (const auto& [key, setting] :
       {std::pair{n.instruction, "data.instruction_key"}, std::pair{n.input, "data.input_key"}}) {
    const auto part = optional_string(record, key, where, std::string(setting) + " names it");
    if (part && !part->empty()) user += (user.empty() ? "" : "\n") + *part;
  }
  prompt.push_back({{"role", "user"}, {"content", user}});
  const auto output = record.find(n.output);
  if (output == record.end() || !output->is_string()) {
    fail(where,
         "an Alpaca record needs " + quote(n.output) +
             ", a string (the answer; "
             "data.output_key names it), got " +
             (output == record.end() ? "none; its keys: " + keys_of(record) : type_name(*output)));
  }
  Json out = {{"prompt", std::move(prompt)},
              {"completion", Json::array({{{"role", "assistant"}, {"content", *output}}})}};
  add_tools(record, out, where);
  return out;
}

// The format of a record under data.format auto, by its keys; nullopt for none. The parser's own
// records first, so that they read as they always have whatever other columns they carry.
std::optional<RecordFormat> recognise(const Json& record, const RecordMapping& m) {
  if (record.contains("messages")) return RecordFormat::messages;
  const bool prompt = record.contains("prompt");
  if (prompt && record.contains("completion")) return RecordFormat::prompt_completion;
  if (record.contains("conversations")) return RecordFormat::sharegpt;
  if (record.contains(pick(m.instruction_key, "instruction"))) return RecordFormat::alpaca;
  if (prompt) return RecordFormat::prompt_completion;  // without a completion: the parser says so
  return std::nullopt;
}

// The key that makes a record one of `f` (the message list, Alpaca's instruction, "prompt").
std::string defining_key(const Names& n) {
  switch (n.format) {
    case RecordFormat::alpaca:
      return n.instruction;
    case RecordFormat::prompt_completion:
      return "prompt";
    default:
      return n.messages;
  }
}

const char* defining_setting(RecordFormat f) {
  switch (f) {
    case RecordFormat::alpaca:
      return "data.instruction_key";
    case RecordFormat::prompt_completion:
      return "data.format";
    default:
      return "data.messages_key";
  }
}

}  // namespace

const std::vector<std::string>& record_format_names() {
  static const std::vector<std::string> names = {"auto", "messages", "alpaca", "sharegpt",
                                                 "prompt_completion"};
  return names;
}

std::optional<RecordFormat> record_format_named(const std::string& name) {
  const auto& names = record_format_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<RecordFormat>(i);
  }
  return std::nullopt;
}

std::vector<std::pair<std::string, std::string>> record_mapping_problems(const RecordMapping& m) {
  std::vector<std::pair<std::string, std::string>> out;
  if (m.format == RecordFormat::automatic && !m.messages_key.empty()) {
    out.emplace_back("messages_key",
                     "with data.format: auto the list is recognised by its name (messages, "
                     "conversations); set data.format: messages or sharegpt to read the list "
                     "named " +
                         quote(m.messages_key));
  }
  std::vector<std::pair<std::string, size_t>> seen;
  for (size_t r = 0; r < 5; ++r) {
    if (role_setting(m, r)->empty()) continue;
    for (const auto& name : split_names(*role_setting(m, r))) {
      if (name.empty()) {
        out.emplace_back(role_key(r), "an empty name in " + quote(*role_setting(m, r)) +
                                          "; write the names separated by commas");
      }
      for (const auto& [other, role] : seen) {
        if (other == name && role != r) {
          out.emplace_back(role_key(r), quote(name) + " is data." + role_key(role) +
                                            "'s too; a name maps to one role");
        }
      }
      seen.emplace_back(name, r);
    }
  }
  return out;
}

std::optional<std::string> normalize_chat_line(std::string_view line, const RecordMapping& m,
                                               const std::string& where) {
  const Json record = Json::parse(line.begin(), line.end(), nullptr, false);
  const bool own = m.format == RecordFormat::alpaca || m.format == RecordFormat::sharegpt;
  if (record.is_discarded() || (!record.is_object() && !own)) return std::nullopt;
  if (!record.is_object()) fail(where, "a record must be a JSON object, got " + type_name(record));
  const auto format = m.format == RecordFormat::automatic ? recognise(record, m) : m.format;
  if (!format) {
    fail(where, "the record's keys (" + keys_of(record) +
                    ") are none of a chat format's: \"messages\" (OpenAI messages), "
                    "\"conversations\" (ShareGPT), " +
                    quote(pick(m.instruction_key, "instruction")) +
                    " (Alpaca), \"prompt\" and \"completion\"; set data.format and the "
                    "data.*_key settings that name its columns");
  }
  const Names n = names_for(m, *format);
  const std::string key = defining_key(n);
  if (!record.contains(key)) {
    fail(where, "data.format is " + record_format_names()[static_cast<size_t>(*format)] +
                    " and the record has no " + quote(key) + " (its keys: " + keys_of(record) +
                    "); set " + defining_setting(*format) +
                    " to the column that holds it, or "
                    "data.format to the record's format");
  }
  switch (*format) {
    case RecordFormat::prompt_completion:
      return std::nullopt;
    case RecordFormat::messages:
      if (messages_as_they_are(m)) return std::nullopt;
      return convert_list(record, n, where).dump();
    case RecordFormat::sharegpt:
      return convert_list(record, n, where).dump();
    default:
      return convert_alpaca(record, n, where).dump();
  }
}

}  // namespace trainer::data
