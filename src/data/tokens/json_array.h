// Files that hold one JSON array of records, pretty-printed or not, as LLaMA-Factory's and
// Alpaca's own data files are (alpaca_data.json):
//
//   [
//     {"instruction": "...", "input": "", "output": "..."},
//     ...
//   ]
//
// The record data sets (chat, preference) read such a file as JSON Lines of its elements: each
// element's text goes to the same record parser as a JSONL line, named FILE:LINE by the line on
// which the element starts, and draws its split (data.val_fraction) as record i + 1 of a JSONL
// file does (line i + 1), so that the same records in JSONL split and train alike.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace trainer::data {

// A file that starts as a JSON array and is not one: the message names FILE:LINE:COLUMN.
class JsonArrayError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct JsonArrayElement {
  std::string_view text;  // the element's JSON, as it stands in the file
  int64_t line = 0;       // the line it starts on (1-based)
  int64_t index = 0;      // its place in the array (0-based)
};

// Whether `text` (a file's bytes) is meant as a JSON array: its first byte that is not white
// space (nor a UTF-8 byte order mark) is '['. A JSONL line is an object, never an array.
bool starts_json_array(std::string_view text);

// The elements of the array that `text` holds (`file` names it in errors), in order. Checks the
// array's structure: brackets and braces that match, strings that end, commas between
// elements, nothing after the closing bracket; each element's own JSON is left to the record
// parser. Throws JsonArrayError.
std::vector<JsonArrayElement> json_array_elements(std::string_view text, const std::string& file);

}  // namespace trainer::data
