#include "text/chat/chat_template.h"

#include <array>
#include <cstdio>
#include <ctime>
#include <utility>

#include "text/chat/python_json.h"

namespace trainer::data {
namespace {

const std::array<std::pair<ChatFormat, const char*>, 8> kNames = {{
    {ChatFormat::llama3, "llama3"},
    {ChatFormat::llama31, "llama3.1"},
    {ChatFormat::llama32, "llama3.2"},
    {ChatFormat::chatml, "chatml"},
    {ChatFormat::qwen2, "qwen2"},
    {ChatFormat::qwen25, "qwen2.5"},
    {ChatFormat::qwen3, "qwen3"},
    {ChatFormat::plain, "plain"},
}};

// The published templates, by chat_template_hash of their text (copies in
// tests/data/chat_templates/, which tests/chat_check.py renders with transformers).
struct Known {
  uint64_t hash;
  ChatFormat format;
};
const std::array<Known, 8> kPublished = {{
    {0x0e60067a5537498eULL, ChatFormat::llama3},   // Meta-Llama-3-8B-Instruct
    {0xcc0368e1ffb6b958ULL, ChatFormat::llama31},  // Llama-3.1-8B-Instruct, Llama-3.3-70B-Instruct
    {0x368f4c34b8554414ULL, ChatFormat::llama32},  // Llama-3.2-1B-Instruct, Llama-3.2-3B-Instruct
    {0x88bf4138d5c826f0ULL, ChatFormat::chatml},   // plain ChatML (many fine-tunes)
    {0x8a87094e0e1e24c5ULL, ChatFormat::qwen2},    // Qwen2-*-Instruct
    {0xe642ce246d7f2e3dULL, ChatFormat::qwen25},   // Qwen2.5-*-Instruct
    {0x959a4551391a6549ULL, ChatFormat::qwen3},    // Qwen3 (as updated after its release)
    {0x2bfdb7aa9754484eULL, ChatFormat::qwen3},    // Qwen3 (as first released)
}};

constexpr const char* kLlamaEot = "<|eot_id|>";
constexpr const char* kImStart = "<|im_start|>";
constexpr const char* kImEnd = "<|im_end|>";

// A UTF-8 code point starting at s[i] (its length in `n`); -1 for a malformed byte (n = 1).
int32_t decode_at(std::string_view s, size_t i, size_t& n) {
  const auto b = static_cast<unsigned char>(s[i]);
  n = 1;
  if (b < 0x80) return b;
  const size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
  if (len == 0 || i + len > s.size()) return -1;
  int32_t cp = b & (0x3F >> (len - 1));
  for (size_t k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (c & 0x3F);
  }
  n = len;
  return cp;
}

// Python's str.isspace() for one code point.
bool python_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Python's s.strip(chars) for one ASCII character in `which` (lstrip, rstrip or both).
enum class Side { left, right, both };
std::string strip_char(std::string_view s, char c, Side which) {
  size_t b = 0, e = s.size();
  if (which != Side::right) {
    while (b < e && s[b] == c) ++b;
  }
  if (which != Side::left) {
    while (e > b && s[e - 1] == c) --e;
  }
  return std::string(s.substr(b, e - b));
}

// Appends pieces to a text, recording assistant turns.
class Writer {
 public:
  explicit Writer(RenderedChat& out) : out_(out) {}
  void put(std::string_view piece) { out_.text.append(piece); }
  // An assistant turn: `prompt` (what add_generation_prompt adds) then `body`.
  void turn(size_t message, std::string_view prompt, std::string_view body) {
    put(prompt);
    const size_t begin = out_.text.size();
    put(body);
    out_.turns.push_back({message, begin, out_.text.size()});
  }

 private:
  RenderedChat& out_;
};

constexpr const char* kToolFormats = "llama3.1, llama3.2, qwen2.5 and qwen3";

// What `format` does not render: a role, tool calls, tool definitions.
void check_renders(ChatFormat format, const std::vector<ChatMessage>& messages,
                   const ChatTools& tools) {
  const bool with_tools = chat_format_renders_tools(format);
  const std::string name = chat_format_name(format);
  if (!with_tools && tools && !tools->empty()) {
    throw ChatRenderError(ChatRenderError::kRecord,
                          "the " + name + " chat template renders no tool definitions (" +
                              kToolFormats + " do); remove the key",
                          "tools");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant" && !(with_tools && r == "tool")) {
      throw ChatRenderError(
          i, "\"" + r + "\" is not a role the " + name + " chat template renders (system, user, " +
                 (with_tools
                      ? "assistant, tool)"
                      : "assistant; tool messages render in " + std::string(kToolFormats) + ")"));
    }
    if (!with_tools && !messages[i].tool_calls.empty()) {
      throw ChatRenderError(
          i, "the " + name + " chat template renders no tool calls (" + kToolFormats + " do)",
          "tool_calls");
    }
  }
}

// A call's arguments as tojson prints them (a string quoted as JSON), or as given where
// `raw_strings` (Qwen 3 prints a string as it is).
std::string call_arguments(const ChatToolCall& call, bool raw_strings) {
  return call.arguments_string && !raw_strings ? python_json_quote(call.arguments) : call.arguments;
}

std::string llama_header(const std::string& role) {
  return "<|start_header_id|>" + role + "<|end_header_id|>\n\n";
}

// Llama 3.1 and 3.2's first user turn with tools (tools_in_user_message, their default): the
// guidance, each definition as tojson(indent=4), then the message's content. `first` is the
// message after the system one; returns the index of the message after it.
size_t put_llama_tools(ChatFormat format, const std::vector<ChatMessage>& messages, size_t first,
                       const std::vector<ChatTool>& tools, Writer& w) {
  const std::string name = chat_format_name(format);
  if (first >= messages.size()) {
    throw ChatRenderError(ChatRenderError::kRecord,
                          "the " + name +
                              " chat template puts the tool definitions into the first user "
                              "message, and the record has none (transformers raises)",
                          "tools");
  }
  if (messages[first].role != "user") {
    throw ChatRenderError(first,
                          "the " + name +
                              " chat template puts the tool definitions into the first message "
                              "after the system one, as a user turn; this is " +
                              messages[first].role + " (make it a user message)");
  }
  std::string block = llama_header("user") +
                      "Given the following functions, please respond with a JSON for a function "
                      "call with its proper arguments that best answers the given prompt.\n\n"
                      "Respond in the format {\"name\": function name, \"parameters\": "
                      "dictionary of argument name and its value}.Do not use variables.\n\n";
  for (const auto& t : tools) block += t.json_indented + "\n\n";
  w.put(block + python_strip(messages[first].content) + kLlamaEot);
  return first + 1;
}

// Llama 3.1 and 3.2's system turn; returns the index of the first message after it.
size_t put_llama_system(ChatFormat format, const std::vector<ChatMessage>& messages,
                        const ChatSpecials& specials, bool tools, Writer& w) {
  std::string system;
  size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    system = python_strip(messages[0].content);
    first = 1;
  }
  const std::string date = !specials.date.empty()          ? specials.date
                           : format == ChatFormat::llama32 ? chat_today()
                                                           : "26 Jul 2024";
  w.put(specials.bos);
  w.put(llama_header("system"));
  if (tools) w.put("Environment: ipython\n");
  w.put("Cutting Knowledge Date: December 2023\nToday Date: " + date + "\n\n");
  w.put(system + kLlamaEot);
  return first;
}

void render_llama(ChatFormat format, const std::vector<ChatMessage>& messages,
                  const ChatSpecials& specials, const ChatTools& tools, Writer& w) {
  size_t first = 0;
  if (format == ChatFormat::llama3) {
    w.put(messages.empty() ? "" : specials.bos);
  } else {
    first = put_llama_system(format, messages, specials, tools.has_value(), w);
    if (tools) first = put_llama_tools(format, messages, first, *tools, w);
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (m.role == "tool") {
      // The template prints a content that is iterable (a string is) as tojson.
      w.put(llama_header("ipython") + python_json_quote(m.content) + kLlamaEot);
    } else if (!m.tool_calls.empty()) {
      if (m.tool_calls.size() != 1) {
        throw ChatRenderError(i,
                              std::to_string(m.tool_calls.size()) + " calls in one message: the " +
                                  chat_format_name(format) +
                                  " chat template renders one a message (transformers raises); "
                                  "give each call a message of its own",
                              "tool_calls");
      }
      const auto& call = m.tool_calls[0];
      w.turn(i, llama_header("assistant"),
             "{\"name\": \"" + call.name + "\", \"parameters\": " + call_arguments(call, false) +
                 "}" + kLlamaEot);
    } else if (m.role == "assistant") {
      w.turn(i, llama_header(m.role), python_strip(m.content) + kLlamaEot);
    } else {
      w.put(llama_header(m.role) + python_strip(m.content) + kLlamaEot);
    }
  }
}

constexpr const char* kQwen25System =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// A Qwen tool call: <tool_call> and the call as JSON.
std::string qwen_call(const ChatToolCall& call, bool raw_strings) {
  return "<tool_call>\n{\"name\": \"" + call.name +
         "\", \"arguments\": " + call_arguments(call, raw_strings) + "}\n</tool_call>";
}

// Qwen 3's index of the last user message (its template's ns.last_query_index): the last one not
// wholly a <tool_response>, else the last message.
size_t last_query(const std::vector<ChatMessage>& messages) {
  for (size_t k = messages.size(); k-- > 0;) {
    const auto& c = messages[k].content;
    const bool tool = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 &&
                      c.compare(c.size() - 16, 16, "</tool_response>") == 0;
    if (messages[k].role == "user" && !tool) return k;
  }
  return messages.size() - 1;
}

// A Qwen 3 assistant turn's body: reasoning split off the content, and kept in a <think> block
// for turns after the last user message that are the last or have reasoning.
std::string qwen3_body(const ChatMessage& m, bool after_query, bool last) {
  std::string content = m.content, reasoning;
  if (m.reasoning) {
    reasoning = *m.reasoning;
  } else if (content.find("</think>") != std::string::npos) {
    // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
    const std::string head =
        strip_char(content.substr(0, content.find("</think>")), '\n', Side::right);
    const size_t open = head.rfind("<think>");
    reasoning =
        strip_char(open == std::string::npos ? head : head.substr(open + 7), '\n', Side::left);
    content = strip_char(content.substr(content.rfind("</think>") + 8), '\n', Side::left);
  }
  std::string body = content;
  if (after_query && (last || !reasoning.empty())) {
    body = "<think>\n" + strip_char(reasoning, '\n', Side::both) + "\n</think>\n\n" +
           strip_char(content, '\n', Side::left);
  }
  for (size_t k = 0; k < m.tool_calls.size(); ++k) {
    if (k > 0 || !content.empty()) body += "\n";
    body += qwen_call(m.tool_calls[k], /*raw_strings=*/true);
  }
  return body + kImEnd + "\n";
}

// A Qwen 2.5 assistant turn with tool calls, after "<|im_start|>assistant\n".
std::string qwen25_calls_body(const ChatMessage& m) {
  std::string body = m.content.empty() ? "" : "\n" + m.content;
  for (const auto& call : m.tool_calls) body += "\n" + qwen_call(call, /*raw_strings=*/false);
  return body.substr(1) + kImEnd + "\n";  // the first "\n" ends the header
}

// Qwen 2.5 and 3's system turn with tools: the system message's content (Qwen 2.5: else its
// default), then the definitions.
void put_qwen_tools(ChatFormat format, const std::vector<ChatMessage>& messages,
                    const std::vector<ChatTool>& tools, Writer& w) {
  std::string s = "<|im_start|>system\n";
  if (!messages.empty() && messages[0].role == "system") {
    s += messages[0].content + "\n\n";
  } else if (format == ChatFormat::qwen25) {
    s += std::string(kQwen25System) + "\n\n";
  }
  s += "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
       "provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const auto& t : tools) s += "\n" + t.json;
  s += "\n</tools>\n\nFor each function call, return a json object with function name and "
       "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
       "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
  w.put(s);
}

// Qwen 2.5 and 3's tool message: a <tool_response> in a user turn that runs over consecutive tool
// messages.
void put_qwen_tool_response(const std::vector<ChatMessage>& messages, size_t i, Writer& w) {
  std::string s;
  if (i == 0 || messages[i - 1].role != "tool") s += "<|im_start|>user";
  s += "\n<tool_response>\n" + messages[i].content + "\n</tool_response>";
  if (i + 1 == messages.size() || messages[i + 1].role != "tool") s += "<|im_end|>\n";
  w.put(s);
}

void render_chatml(ChatFormat format, const std::vector<ChatMessage>& messages,
                   const ChatTools& tools, Writer& w) {
  const bool listed = tools && !tools->empty();  // the templates' `if tools`
  if (listed) {
    put_qwen_tools(format, messages, *tools, w);
  } else if (!messages.empty() && messages[0].role != "system") {
    if (format == ChatFormat::qwen2) {
      w.put("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
    } else if (format == ChatFormat::qwen25) {
      w.put(std::string("<|im_start|>system\n") + kQwen25System + "<|im_end|>\n");
    }
  }
  const size_t query = format == ChatFormat::qwen3 && !messages.empty() ? last_query(messages) : 0;
  const bool system_first = !messages.empty() && messages[0].role == "system";
  for (size_t i = listed && system_first ? 1 : 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string head = std::string(kImStart) + m.role + "\n";
    if (m.role == "tool") {
      put_qwen_tool_response(messages, i, w);
    } else if (m.role != "assistant") {
      w.put(head + m.content + kImEnd + "\n");
    } else if (format == ChatFormat::qwen3) {
      w.turn(i, head, qwen3_body(m, i > query, i + 1 == messages.size()));
    } else if (!m.tool_calls.empty()) {
      w.turn(i, head, qwen25_calls_body(m));
    } else {
      w.turn(i, head, m.content + kImEnd + "\n");
    }
  }
}

void render_plain(const std::vector<ChatMessage>& messages, const ChatSpecials& specials,
                  Writer& w) {
  w.put(specials.bos);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "assistant") {
      w.turn(i, "", messages[i].content + specials.eos);
    } else {
      w.put(messages[i].content);
    }
  }
}

}  // namespace

const std::vector<std::string>& chat_format_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [format, name] : kNames) out.push_back(name);
    return out;
  }();
  return names;
}

std::string chat_format_name(ChatFormat format) {
  for (const auto& [f, name] : kNames) {
    if (f == format) return name;
  }
  return "?";
}

std::optional<ChatFormat> chat_format_named(const std::string& name) {
  for (const auto& [format, n] : kNames) {
    if (name == n) return format;
  }
  return std::nullopt;
}

uint64_t chat_template_hash(std::string_view text) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::optional<ChatFormat> recognize_chat_template(std::string_view text) {
  const uint64_t h = chat_template_hash(text);
  for (const auto& k : kPublished) {
    if (k.hash == h) return k.format;
  }
  return std::nullopt;
}

bool chat_format_renders_tools(ChatFormat format) {
  return format == ChatFormat::llama31 || format == ChatFormat::llama32 ||
         format == ChatFormat::qwen25 || format == ChatFormat::qwen3;
}

RenderedChat render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                         const ChatSpecials& specials, const ChatTools& tools) {
  check_renders(format, messages, tools);
  RenderedChat out;
  Writer w(out);
  switch (format) {
    case ChatFormat::llama3:
    case ChatFormat::llama31:
    case ChatFormat::llama32:
      render_llama(format, messages, specials, tools, w);
      break;
    case ChatFormat::plain:
      render_plain(messages, specials, w);
      break;
    default:
      render_chatml(format, messages, tools, w);
  }
  return out;
}

std::string render_generation_prompt(ChatFormat format, const std::vector<ChatMessage>& messages,
                                     const ChatSpecials& specials, const ChatTools& tools) {
  std::vector<ChatMessage> with_reply = messages;
  with_reply.push_back({"assistant", "", std::nullopt});
  RenderedChat chat = render_chat(format, with_reply, specials, tools);
  chat.text.resize(chat.turns.back().begin);
  return chat.text;
}

std::string chat_end_of_turn(ChatFormat format, const ChatSpecials& specials) {
  switch (format) {
    case ChatFormat::llama3:
    case ChatFormat::llama31:
    case ChatFormat::llama32:
      return kLlamaEot;
    case ChatFormat::plain:
      return specials.eos;
    default:
      return kImEnd;
  }
}

std::vector<std::string> chat_format_tokens(ChatFormat format) {
  switch (format) {
    case ChatFormat::llama3:
    case ChatFormat::llama31:
    case ChatFormat::llama32:
      return {"<|start_header_id|>", "<|end_header_id|>", kLlamaEot};
    case ChatFormat::plain:
      return {};
    default:
      return {kImStart, kImEnd};
  }
}

bool chat_format_dated_today(ChatFormat format) {
  return format == ChatFormat::llama32;
}

std::string chat_today() {
  static const char* const kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                        "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char day[8];
  std::snprintf(day, sizeof day, "%02d", local.tm_mday);
  return std::string(day) + " " + kMonths[local.tm_mon] + " " +
         std::to_string(1900 + local.tm_year);
}

std::string python_strip(std::string_view text) {
  size_t b = 0, n = 0;
  while (b < text.size() && python_space(decode_at(text, b, n))) b += n;
  size_t e = text.size();
  while (e > b) {
    size_t start = e - 1;  // the start of the code point ending at e
    while (start > b && e - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
      --start;
    }
    const int32_t cp = decode_at(text, start, n);
    if (start + n != e || !python_space(cp)) break;
    e = start;
  }
  return std::string(text.substr(b, e - b));
}

}  // namespace trainer::data
