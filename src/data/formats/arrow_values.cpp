// Arrow's headers need C++20 (std::span, std::bit_width): this file and arrow_rows.cpp compile
// as C++20 (trainer_arrow_sources, cmake/Arrow.cmake). nlohmann/json's code paths are pinned to
// its C++17 ones, those of every other file, so that its inline functions are the same in every
// object file.
#define JSON_HAS_CPP_17
#define JSON_HAS_CPP_14
#define JSON_HAS_CPP_11
#define JSON_HAS_THREE_WAY_COMPARISON 0
#define JSON_HAS_RANGES 0

#include "data/formats/arrow_values.h"

#include <arrow/api.h>
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace trainer::data::arrow_values {
namespace {

using Json = nlohmann::ordered_json;  // a struct's fields in the file's order

bool integer_type(arrow::Type::type id) {
  return arrow::is_integer(id);
}

bool string_type(arrow::Type::type id) {
  return id == arrow::Type::STRING || id == arrow::Type::LARGE_STRING ||
         id == arrow::Type::STRING_VIEW;
}

bool list_type(arrow::Type::type id) {
  return id == arrow::Type::LIST || id == arrow::Type::LARGE_LIST ||
         id == arrow::Type::FIXED_SIZE_LIST || id == arrow::Type::LIST_VIEW ||
         id == arrow::Type::LARGE_LIST_VIEW;
}
// The integers of a list at [begin, begin + n) of `values`, when they are integers.
template <typename ArrayType>
bool integer_items(const arrow::Array& values, int64_t begin, int64_t n, Json::array_t& out) {
  const auto* typed = dynamic_cast<const ArrayType*>(&values);
  if (typed == nullptr) return false;
  for (int64_t j = begin; j < begin + n; ++j) {
    if (typed->IsNull(j)) {
      out.emplace_back(nullptr);
    } else {
      out.emplace_back(typed->Value(j));
    }
  }
  return true;
}

void list_to_json(const arrow::Array& values, int64_t begin, int64_t n, Json& out) {
  out = Json::array();
  auto& items = out.get_ref<Json::array_t&>();
  items.reserve(static_cast<size_t>(n));
  switch (values.type_id()) {  // the token rows' fast path
    case arrow::Type::INT32:
      if (integer_items<arrow::Int32Array>(values, begin, n, items)) return;
      break;
    case arrow::Type::INT64:
      if (integer_items<arrow::Int64Array>(values, begin, n, items)) return;
      break;
    default:
      break;
  }
  for (int64_t j = begin; j < begin + n; ++j) to_json(values, j, items.emplace_back());
}

template <typename ListArrayType>
void list_row(const arrow::Array& array, int64_t i, Json& out) {
  const auto& list = static_cast<const ListArrayType&>(array);
  list_to_json(*list.values(), list.value_offset(i), list.value_length(i), out);
}

void struct_row(const arrow::Array& array, int64_t i, Json& out) {
  const auto& s = static_cast<const arrow::StructArray&>(array);
  out = Json::object();
  const auto& type = *s.struct_type();
  for (int f = 0; f < type.num_fields(); ++f) to_json(*s.field(f), i, out[type.field(f)->name()]);
}

template <typename ArrayType>
std::string text_of(const arrow::Array& array, int64_t i) {
  return std::string(static_cast<const ArrayType&>(array).GetView(i));
}

template <typename ArrayType>
Json binary_of(const arrow::Array& array, int64_t i) {
  const auto view = static_cast<const ArrayType&>(array).GetView(i);
  return Json::binary(std::vector<uint8_t>(view.begin(), view.end()));
}

// Integers, floats and booleans: whether `array` is one, with its value in `out`.
bool number_to_json(const arrow::Array& array, int64_t i, Json& out) {
  switch (array.type_id()) {
    case arrow::Type::BOOL:
      out = static_cast<const arrow::BooleanArray&>(array).Value(i);
      return true;
    case arrow::Type::INT8:
      out = static_cast<const arrow::Int8Array&>(array).Value(i);
      return true;
    case arrow::Type::INT16:
      out = static_cast<const arrow::Int16Array&>(array).Value(i);
      return true;
    case arrow::Type::INT32:
      out = static_cast<const arrow::Int32Array&>(array).Value(i);
      return true;
    case arrow::Type::INT64:
      out = static_cast<const arrow::Int64Array&>(array).Value(i);
      return true;
    case arrow::Type::UINT8:
      out = static_cast<const arrow::UInt8Array&>(array).Value(i);
      return true;
    case arrow::Type::UINT16:
      out = static_cast<const arrow::UInt16Array&>(array).Value(i);
      return true;
    case arrow::Type::UINT32:
      out = static_cast<const arrow::UInt32Array&>(array).Value(i);
      return true;
    case arrow::Type::UINT64:
      out = static_cast<const arrow::UInt64Array&>(array).Value(i);
      return true;
    case arrow::Type::FLOAT:
      out = static_cast<double>(static_cast<const arrow::FloatArray&>(array).Value(i));
      return true;
    case arrow::Type::DOUBLE:
      out = static_cast<const arrow::DoubleArray&>(array).Value(i);
      return true;
    default:
      return false;
  }
}

template <typename ArrayType>
bool append_integers(const arrow::Array& values, int64_t begin, int64_t n,
                     std::vector<int64_t>& out) {
  const auto* typed = dynamic_cast<const ArrayType*>(&values);
  if (typed == nullptr) return false;
  if (values.null_count() > 0) {
    for (int64_t j = begin; j < begin + n; ++j) {
      if (values.IsNull(j))
        throw std::runtime_error("item " + std::to_string(j - begin) + " is null");
    }
  }
  const auto* raw = typed->raw_values();
  out.insert(out.end(), raw + begin, raw + begin + n);
  return true;
}

// The integers of list `i` of `array` (a list of integers) into `out`.
template <typename ListArrayType>
void list_integers(const arrow::Array& array, int64_t i, std::vector<int64_t>& out) {
  const auto& list = static_cast<const ListArrayType&>(array);
  const auto& values = *list.values();
  const int64_t begin = list.value_offset(i), n = list.value_length(i);
  out.clear();
  out.reserve(static_cast<size_t>(n));
  const bool done = append_integers<arrow::Int32Array>(values, begin, n, out) ||
                    append_integers<arrow::Int64Array>(values, begin, n, out) ||
                    append_integers<arrow::Int16Array>(values, begin, n, out) ||
                    append_integers<arrow::Int8Array>(values, begin, n, out) ||
                    append_integers<arrow::UInt8Array>(values, begin, n, out) ||
                    append_integers<arrow::UInt16Array>(values, begin, n, out) ||
                    append_integers<arrow::UInt32Array>(values, begin, n, out);
  if (!done) throw std::runtime_error("not a list of integers (" + array.type()->ToString() + ")");
}

}  // namespace

// Arrow's message on one line.
std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

bool of_kind(const arrow::DataType& type, ColumnKind kind) {
  const auto id = type.id();
  switch (kind) {
    case ColumnKind::string:
      return string_type(id);
    case ColumnKind::integer:
      return integer_type(id);
    case ColumnKind::list:
      return list_type(id);
    case ColumnKind::integer_list:
      return list_type(id) && integer_type(type.field(0)->type()->id());
    case ColumnKind::struct_list:
      return list_type(id) && type.field(0)->type()->id() == arrow::Type::STRUCT;
  }
  return false;
}

const char* kind_text(ColumnKind kind) {
  switch (kind) {
    case ColumnKind::string:
      return "a string";
    case ColumnKind::integer:
      return "an integer";
    case ColumnKind::list:
      return "a list";
    case ColumnKind::integer_list:
      return "a list of integers";
    case ColumnKind::struct_list:
      return "a list of structs (such as {role, content})";
  }
  return "";
}
// Value `i` of `array` as JSON.
void to_json(const arrow::Array& array, int64_t i, Json& out) {
  if (array.IsNull(i)) {
    out = nullptr;
    return;
  }
  if (number_to_json(array, i, out)) return;
  switch (array.type_id()) {
    case arrow::Type::STRING:
      out = text_of<arrow::StringArray>(array, i);
      return;
    case arrow::Type::LARGE_STRING:
      out = text_of<arrow::LargeStringArray>(array, i);
      return;
    case arrow::Type::STRING_VIEW:
      out = text_of<arrow::StringViewArray>(array, i);
      return;
    case arrow::Type::BINARY:
      out = binary_of<arrow::BinaryArray>(array, i);
      return;
    case arrow::Type::LARGE_BINARY:
      out = binary_of<arrow::LargeBinaryArray>(array, i);
      return;
    case arrow::Type::LIST:
    case arrow::Type::MAP:  // a list of {key, value} structs
      list_row<arrow::ListArray>(array, i, out);
      return;
    case arrow::Type::LARGE_LIST:
      list_row<arrow::LargeListArray>(array, i, out);
      return;
    case arrow::Type::FIXED_SIZE_LIST:
      list_row<arrow::FixedSizeListArray>(array, i, out);
      return;
    case arrow::Type::LIST_VIEW:
      list_row<arrow::ListViewArray>(array, i, out);
      return;
    case arrow::Type::LARGE_LIST_VIEW:
      list_row<arrow::LargeListViewArray>(array, i, out);
      return;
    case arrow::Type::STRUCT:
      struct_row(array, i, out);
      return;
    case arrow::Type::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(array);
      to_json(*d.dictionary(), d.GetValueIndex(i), out);
      return;
    }
    default: {  // dates, times, decimals, ...: their text
      auto scalar = array.GetScalar(i);
      if (!scalar.ok()) throw std::runtime_error(one_line(scalar.status().ToString()));
      out = (*scalar)->ToString();
    }
  }
}
void integers_of(const arrow::Array& array, int64_t i, std::vector<int64_t>& out) {
  if (array.IsNull(i)) throw std::runtime_error("null, expected a list of integers");
  switch (array.type_id()) {
    case arrow::Type::LIST:
      return list_integers<arrow::ListArray>(array, i, out);
    case arrow::Type::LARGE_LIST:
      return list_integers<arrow::LargeListArray>(array, i, out);
    case arrow::Type::FIXED_SIZE_LIST:
      return list_integers<arrow::FixedSizeListArray>(array, i, out);
    default:
      throw std::runtime_error("not a list of integers (" + array.type()->ToString() + ")");
  }
}

}  // namespace trainer::data::arrow_values
