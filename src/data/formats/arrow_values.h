// The values of Arrow arrays as JSON and as integers, and the kinds of Arrow types, for
// arrow_rows.cpp. Names Arrow's types: for the files compiled against Arrow's headers (C++20,
// trainer_arrow_sources in cmake/Arrow.cmake) only.
#pragma once

#include <arrow/type_fwd.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "data/formats/arrow_rows.h"

namespace trainer::data::arrow_values {

// Arrow's message on one line.
std::string one_line(std::string text);

// Whether `type` is of `kind`, and the kind in words ("a list of integers").
bool of_kind(const arrow::DataType& type, ColumnKind kind);
const char* kind_text(ColumnKind kind);

// Value `i` of `array` as JSON (arrow_rows.h lists the types), a struct's fields in the order
// of its type. Throws std::runtime_error for a value Arrow cannot print.
void to_json(const arrow::Array& array, int64_t i, nlohmann::ordered_json& out);

// The integers of list `i` of `array`, a list of integers, into `out`. Throws std::runtime_error
// for a null list or item, or another type.
void integers_of(const arrow::Array& array, int64_t i, std::vector<int64_t>& out);

}  // namespace trainer::data::arrow_values
