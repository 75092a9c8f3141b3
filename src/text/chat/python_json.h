// JSON written as Python's json.dumps writes it with ensure_ascii=False: what transformers' chat
// templates print with their tojson filter (json.dumps(x, ensure_ascii=False, indent=indent)).
// Keys in the order given, ", " and ": " between items (with an indent: "," and a newline), floats
// as Python's repr (1.0, 1e+16, 1e-05), strings with only '"', '\' and control characters escaped.
// Torch-free.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace trainer::data {

// json.dumps(value, ensure_ascii=False[, indent=indent]); indent < 0: none.
std::string python_json_dumps(const nlohmann::ordered_json& value, int indent = -1);

// json.dumps(text, ensure_ascii=False): `text` (UTF-8) as a quoted JSON string.
std::string python_json_quote(std::string_view text);

// Python's repr of a float (the shortest text that reads back as `x`).
std::string python_float_repr(double x);

}  // namespace trainer::data
