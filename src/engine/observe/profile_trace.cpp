#include "engine/observe/profile_trace.h"

#include <nlohmann/json.hpp>

#include <string_view>

namespace trainer::engine {
namespace {

// The position of the `]` closing the array that opens at `open` (a `[`), strings and their
// escapes skipped; npos when it is not closed.
size_t closing_bracket(std::string_view text, size_t open) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = open; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      if (--depth == 0) return i;
    }
  }
  return std::string_view::npos;
}

// Drops the GPU probe's error of a machine without a GPU from the `ERROR` list.
void drop_probe_error(nlohmann::ordered_json& meta) {
  const auto it = meta.find("ERROR");
  if (it == meta.end() || !it->is_array()) return;
  nlohmann::ordered_json kept = nlohmann::ordered_json::array();
  for (const auto& e : *it) {
    if (!e.is_string() ||
        e.get<std::string>().find("gpuGetDeviceCount failed") == std::string::npos) {
      kept.push_back(e);
    }
  }
  if (kept.empty()) {
    meta.erase("ERROR");
  } else {
    *it = kept;
  }
}

}  // namespace

std::string fix_trace_metadata(const std::string& text, const std::string& trace_name) {
  const size_t key = text.find("\"traceEvents\"");
  if (key == std::string::npos) return text;
  const size_t open = text.find('[', key);
  if (open == std::string::npos) return text;
  const size_t close = closing_bracket(text, open);
  if (close == std::string::npos) return text;
  // What follows the events: `, "key": value, ... }`.
  size_t rest = text.find_first_not_of(" \t\r\n", close + 1);
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  if (rest != std::string::npos && text[rest] == ',') {
    meta = nlohmann::ordered_json::parse("{" + text.substr(rest + 1), nullptr, false);
    if (meta.is_discarded() || !meta.is_object()) return text;
  }
  drop_probe_error(meta);
  meta["traceName"] = trace_name;
  std::string out = text.substr(0, close + 1);
  for (const auto& [name, value] : meta.items()) {
    out += ",\n  " + nlohmann::ordered_json(name).dump() + ": " + value.dump();
  }
  out += "\n}\n";
  return out;
}

}  // namespace trainer::engine
