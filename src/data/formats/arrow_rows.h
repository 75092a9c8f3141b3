// The rows of a Parquet file or an Arrow IPC stream file, read with Apache Arrow's C++ libraries
// (the pyarrow wheel's, cmake/Arrow.cmake), one row at a time as a JSON value:
//
//   train-00000-of-00003.parquet      (the Hugging Face Hub's files, Dataset.to_parquet)
//   data-00000-of-00001.arrow         (Dataset.save_to_disk: the IPC *stream* format)
//
// A row is a JSON object of its columns: strings, integers, floats, booleans and nulls as
// themselves, lists as arrays (token rows: arrays of integers), structs as objects (messages:
// arrays of {"role", "content"}), binary as JSON binary; other types (dates, decimals) as their
// text. The file is read in record batches of a few MB, never whole: memory stays bounded
// whatever the file's size. The row count comes from the metadata (Parquet's footer; an Arrow
// stream's batch headers, read once at open without their data), and seek() starts at any row
// (Parquet: at its row group), for exact resume and sharding over ranks.
//
// Rows are numbered from 0, as datasets' ds[i] and pyarrow number them; errors name the file,
// the row and the column: "FILE: row 17, column "messages": ...".
//
// Arrow's headers need C++20; this header includes none (and is C++17), so that only
// arrow_rows.cpp compiles against them.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::data {

// A file that cannot be read as rows: missing, neither Parquet nor an Arrow stream (an Arrow IPC
// file, i.e. Feather, is named as such), truncated or corrupt, a column missing or of another
// type. The message is one line naming the file (and the row and column where they apply).
// Callers turn it into exit 2.
class ArrowRowsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a caller needs of a column (ArrowRows::require).
enum class ColumnKind {
  string,        // a string (large_string, string_view too)
  integer,       // a signed or unsigned integer
  integer_list,  // a list of integers (input_ids, labels, attention_mask)
  struct_list,   // a list of structs (messages: [{role, content}, ...])
  list,          // a list of anything (a prompt given as messages or a string is checked per row)
};

class ArrowRows {
 public:
  enum class Format { parquet, arrow_stream };

  // Opens `path` and reads its metadata; `columns` selects the columns to read, in this order
  // (all of the file's when empty). Throws ArrowRowsError.
  explicit ArrowRows(const std::string& path, const std::vector<std::string>& columns = {});
  ~ArrowRows();
  ArrowRows(ArrowRows&&) noexcept;
  ArrowRows& operator=(ArrowRows&&) noexcept;
  ArrowRows(const ArrowRows&) = delete;
  ArrowRows& operator=(const ArrowRows&) = delete;

  const std::string& path() const;
  Format format() const;
  int64_t num_rows() const;
  // The file's columns (all of them), and those read.
  const std::vector<std::string>& file_columns() const;
  const std::vector<std::string>& columns() const;
  // A column's Arrow type as Arrow writes it, e.g. "list<element: int32>"; "" when absent.
  std::string column_type(const std::string& column) const;
  bool has_column(const std::string& column) const;

  // Throws ArrowRowsError unless `column` is read and of `kind`: "FILE: column "input_ids" is
  // list<element: string>, expected a list of integers".
  void require(const std::string& column, ColumnKind kind) const;

  // The next row read is `row` (0 <= row <= num_rows()).
  void seek(int64_t row);
  // The number of the row next() returns next.
  int64_t position() const;
  // The next row as an object {column: value} into `row`; false at the end. The ordered form
  // keeps the columns and a struct's fields in the file's order (as datasets' ds[i] gives them,
  // and as chat templates print them with tojson).
  bool next(nlohmann::ordered_json& row);
  bool next(nlohmann::json& row);

  // The next row's columns as integers, without JSON (token rows: input_ids, labels), into
  // `lists` (one list a column, in columns() order); false at the end. Every column read must be
  // a list of integers (require(column, ColumnKind::integer_list)); a null list or item throws,
  // naming the file, row and column.
  bool next_integer_lists(std::vector<std::vector<int64_t>>& lists);

  // "FILE: row N" for messages about a row's contents.
  std::string where(int64_t row) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer::data
