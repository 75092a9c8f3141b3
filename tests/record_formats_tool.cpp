// Helper of tests/record_formats_check.py: chat records rewritten into the OpenAI form
// (text/chat/record_formats.h), as the chat data set rewrites each line before parsing it.
//
//   record_formats_tool FILE KEY=VALUE...
//
// KEY=VALUE sets a field of RecordMapping by its data.KEY name (format, messages_key, user_role,
// ...). Prints one JSON line per non-blank line of FILE: {"line": N, "record": the record the
// parser reads (the line's own where it is read as it is)} or {"line": N, "error": message}.
// Exits 2 with "data.KEY: message" lines for settings record_mapping_problems refuses, 1 for an
// unreadable file or a bad argument. Torch-free.
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "text/chat/chat_records.h"
#include "text/chat/record_formats.h"

namespace {

using trainer::data::RecordMapping;

bool set_field(RecordMapping& m, const std::string& key, const std::string& value) {
  if (key == "format") {
    const auto f = trainer::data::record_format_named(value);
    if (f) m.format = *f;
    return f.has_value();
  }
  const std::map<std::string, std::string*> fields = {{"messages_key", &m.messages_key},
                                                      {"role_key", &m.role_key},
                                                      {"content_key", &m.content_key},
                                                      {"system_key", &m.system_key},
                                                      {"instruction_key", &m.instruction_key},
                                                      {"input_key", &m.input_key},
                                                      {"output_key", &m.output_key},
                                                      {"history_key", &m.history_key},
                                                      {"user_role", &m.user_role},
                                                      {"assistant_role", &m.assistant_role},
                                                      {"system_role", &m.system_role},
                                                      {"tool_role", &m.tool_role},
                                                      {"tool_call_role", &m.tool_call_role}};
  const auto it = fields.find(key);
  if (it == fields.end()) return false;
  *it->second = value;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using Json = nlohmann::ordered_json;
  if (argc < 2) {
    std::cerr << "usage: record_formats_tool FILE KEY=VALUE...\n";
    return 1;
  }
  RecordMapping m;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || !set_field(m, arg.substr(0, eq), arg.substr(eq + 1))) {
      std::cerr << "bad setting " << arg << "\n";
      return 1;
    }
  }
  const auto problems = trainer::data::record_mapping_problems(m);
  for (const auto& [key, message] : problems)
    std::cerr << "data." << key << ": " << message << "\n";
  if (!problems.empty()) return 2;
  std::ifstream in(argv[1]);
  if (!in) {
    std::cerr << "cannot read " << argv[1] << "\n";
    return 1;
  }
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (trainer::data::blank_line(line)) continue;
    const std::string where = std::string(argv[1]) + ":" + std::to_string(number);
    try {
      const auto rewritten = trainer::data::normalize_chat_line(line, m, where);
      std::cout << Json{{"line", number}, {"record", Json::parse(rewritten ? *rewritten : line)}}
                << "\n";
    } catch (const trainer::data::ChatRecordError& e) {
      std::cout << Json{{"line", number}, {"error", e.what()}} << "\n";
    } catch (const Json::exception& e) {
      std::cout << Json{{"line", number}, {"error", std::string("not JSON: ") + e.what()}} << "\n";
    }
  }
  return 0;
}
