#include "util/csv_log.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "util/fileio.h"

namespace trainer {
namespace {

bool is_scalar(const nlohmann::json& v) {
  return v.is_number() || v.is_boolean() || v.is_string() || v.is_null();
}

std::string quoted(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (const char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string cell(const nlohmann::json& v) {
  if (v.is_string()) return quoted(v.get<std::string>());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  }
  if (v.is_null()) return "";
  return v.dump();
}

// The number of cells in a row row() wrote (commas outside quotes, plus one).
size_t cells_in(const std::string& line) {
  size_t n = 1;
  bool in_quotes = false;
  for (const char c : line) {
    if (c == '"') in_quotes = !in_quotes;
    if (c == ',' && !in_quotes) ++n;
  }
  return n;
}

}  // namespace

CsvLog::CsvLog(std::string path, std::vector<std::string> leading,
               const std::vector<nlohmann::json>& records)
    : path_(std::move(path)), columns_(std::move(leading)) {
  for (const auto& r : records) add_columns(r);
  std::vector<std::string> rows;
  rows.reserve(records.size());
  for (const auto& r : records) rows.push_back(row(r));
  rewrite(rows);
}

bool CsvLog::add_columns(const nlohmann::json& record) {
  bool added = false;
  for (const auto& [key, value] : record.items()) {
    if (!is_scalar(value) || std::find(columns_.begin(), columns_.end(), key) != columns_.end()) {
      continue;
    }
    columns_.push_back(key);
    added = true;
  }
  return added;
}

std::string CsvLog::header() const {
  std::string out;
  for (const auto& c : columns_) out += (out.empty() ? "" : ",") + quoted(c);
  return out;
}

std::string CsvLog::row(const nlohmann::json& record) const {
  std::string out;
  for (size_t i = 0; i < columns_.size(); ++i) {
    if (i > 0) out += ",";
    const auto it = record.find(columns_[i]);
    if (it != record.end() && is_scalar(*it)) out += cell(*it);
  }
  return out;
}

void CsvLog::rewrite(const std::vector<std::string>& rows) {
  std::string text = header() + "\n";
  for (const auto& r : rows) {
    text += r + std::string(columns_.size() - std::min(columns_.size(), cells_in(r)), ',') + "\n";
  }
  out_.close();
  write_text_atomically(path_, text);
  open_for_append();
}

void CsvLog::open_for_append() {
  out_.open(path_, std::ios::out | std::ios::app);
  if (!out_) throw std::runtime_error(path_ + ": cannot open for writing");
}

void CsvLog::write(const nlohmann::json& record) {
  if (add_columns(record)) {
    // The rows so far, as written, under the wider header.
    out_.close();
    std::ifstream in(path_);
    std::vector<std::string> rows;
    std::string line;
    std::getline(in, line);  // the old header
    while (std::getline(in, line)) rows.push_back(line);
    rows.push_back(row(record));
    rewrite(rows);
    return;
  }
  out_ << row(record) << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error(path_ + ": writing metrics failed (disk full?)");
}

}  // namespace trainer
