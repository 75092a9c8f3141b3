// A CSV file of JSON records, one row per record and one column per scalar field, for tools that
// read tables (spreadsheets, pandas.read_csv, csv.DictReader). Torch-free.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

namespace trainer {

// Columns are `leading` first, then the other fields in the order they first appear; a record
// without a field leaves its cell empty. Numbers are written as JSON writes them (nan, inf and
// -inf where not finite), booleans as true/false, strings quoted where they hold a comma, a quote
// or a line break; arrays and objects are left out. A record with a field not seen before
// rewrites the file (atomically) with the wider header, the earlier rows padded with empty cells;
// other records are appended and flushed.
class CsvLog {
 public:
  // Writes `path` anew with `records` (a resumed run's kept records; empty for a fresh run).
  CsvLog(std::string path, std::vector<std::string> leading,
         const std::vector<nlohmann::json>& records = {});

  void write(const nlohmann::json& record);

 private:
  // Adds the record's new scalar fields to the columns; true when there were any.
  bool add_columns(const nlohmann::json& record);
  std::string header() const;
  std::string row(const nlohmann::json& record) const;
  // The whole file again with the current header: `rows` (each as row() wrote it, possibly
  // narrower) padded to the header's width.
  void rewrite(const std::vector<std::string>& rows);
  void open_for_append();

  std::string path_;
  std::vector<std::string> columns_;
  std::ofstream out_;
};

}  // namespace trainer
