// The rows of a Parquet or Arrow stream file as data/formats/arrow_rows.h reads them, for
// parquet_check.py:
//
//   arrow_rows_tool FILE [--columns a,b] [--require COLUMN:KIND]... [--from ROW] [--count N]
//                        [--seeks ROW,ROW,...] [--integers] [--stats]
//
// Prints a header line {"rows", "format", "columns", "types"}, then each row read as one JSON
// line (from row ROW, N rows; --seeks: a line {"seek": ROW} and N rows from each ROW in turn;
// --integers: read by next_integer_lists); with --stats no rows but a
// last line {"read", "seconds", "rows_per_s", "rss_start_mb", "rss_peak_mb"} (peak: VmHWM). KIND:
// string, integer, integer_list, struct_list, list. A file the reader refuses: its message and
// exit 2.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "data/formats/arrow_rows.h"

namespace {

using trainer::data::ArrowRows;
using trainer::data::ColumnKind;

// A field of /proc/self/status in MB (VmRSS, VmHWM).
double status_mb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::atof(line.c_str() + key.size() + 1) / 1024.0;
  }
  return 0;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, sep);) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

ColumnKind kind_of(const std::string& name) {
  if (name == "string") return ColumnKind::string;
  if (name == "integer") return ColumnKind::integer;
  if (name == "integer_list") return ColumnKind::integer_list;
  if (name == "struct_list") return ColumnKind::struct_list;
  if (name == "list") return ColumnKind::list;
  std::cerr << "unknown kind " << name << "\n";
  std::exit(2);
}

struct Args {
  std::string file;
  std::vector<std::string> columns, require;
  std::vector<int64_t> seeks;
  int64_t from = 0, count = -1;
  bool stats = false, integers = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--columns" && has_value) {
      a.columns = split(argv[++i], ',');
    } else if (arg == "--require" && has_value) {
      a.require.push_back(argv[++i]);
    } else if (arg == "--seeks" && has_value) {
      for (const auto& k : split(argv[++i], ',')) a.seeks.push_back(std::atoll(k.c_str()));
    } else if (arg == "--from" && has_value) {
      a.from = std::atoll(argv[++i]);
    } else if (arg == "--count" && has_value) {
      a.count = std::atoll(argv[++i]);
    } else if (arg == "--stats") {
      a.stats = true;
    } else if (arg == "--integers") {
      a.integers = true;
    } else if (a.file.empty()) {
      a.file = arg;
    } else {
      std::cerr << "usage: arrow_rows_tool FILE [--columns a,b] [--require COLUMN:KIND] "
                   "[--from ROW] [--count N] [--seeks ROW,...] [--integers] [--stats]\n";
      std::exit(2);
    }
  }
  return a;
}

// Up to a.count rows (all when negative) from the reader's position, printed unless --stats.
int64_t read_rows(ArrowRows& rows, const Args& a) {
  nlohmann::json row;
  std::vector<std::vector<int64_t>> lists;
  auto next = [&] {
    if (!a.integers) return rows.next(row);
    if (!rows.next_integer_lists(lists)) return false;
    if (!a.stats) {
      row = nlohmann::json::object();
      for (size_t c = 0; c < lists.size(); ++c) row[rows.columns()[c]] = lists[c];
    }
    return true;
  };
  int64_t read = 0;
  while ((a.count < 0 || read < a.count) && next()) {
    ++read;
    if (!a.stats) {
      std::cout << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
  }
  return read;
}

int run(const Args& a) {
  const double rss_start = status_mb("VmRSS");
  const auto t0 = std::chrono::steady_clock::now();
  ArrowRows rows(a.file, a.columns);
  for (const auto& r : a.require) {
    const auto colon = r.rfind(':');
    rows.require(r.substr(0, colon), kind_of(r.substr(colon + 1)));
  }
  nlohmann::json header = {
      {"rows", rows.num_rows()},
      {"format", rows.format() == ArrowRows::Format::parquet ? "parquet" : "arrow_stream"},
      {"columns", rows.columns()}};
  for (const auto& c : rows.columns()) header["types"][c] = rows.column_type(c);
  std::cout << header.dump() << "\n";
  int64_t read = 0;
  if (a.seeks.empty()) {
    if (a.from != 0) rows.seek(a.from);
    read = read_rows(rows, a);
  }
  for (const int64_t k : a.seeks) {
    std::cout << nlohmann::json{{"seek", k}}.dump() << "\n";
    rows.seek(k);
    read += read_rows(rows, a);
  }
  if (a.stats) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << nlohmann::json{{"read", read},
                                {"seconds", seconds},
                                {"rows_per_s", read / seconds},
                                {"rss_start_mb", rss_start},
                                {"rss_peak_mb", status_mb("VmHWM")}}
                     .dump()
              << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    return run(args);
  } catch (const trainer::data::ArrowRowsError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
