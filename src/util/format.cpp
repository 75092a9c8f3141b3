#include "util/format.h"

#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>

namespace trainer {

std::string strprintf(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, args);
  va_end(args);
  return out;
}

std::string format_number(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[64];
  // Whole numbers as written (300, not 3e+2), up to where a double holds every integer.
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return v == 0 ? "0" : buf;
  }
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  // "1e-08" -> "1e-8": drop the exponent's leading zeros.
  const auto e = s.find('e');
  if (e != std::string::npos) {
    size_t i = e + 1;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    size_t j = i;
    while (j + 1 < s.size() && s[j] == '0') ++j;
    s.erase(i, j - i);
  }
  return s;
}

double parse_size(const std::string& text) {
  size_t end = 0;
  while (end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) {
    ++end;
  }
  std::string unit = text.substr(end);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  static const std::map<std::string, double> units = {{"", 1},
                                                      {"B", 1},
                                                      {"KB", 1e3},
                                                      {"MB", 1e6},
                                                      {"GB", 1e9},
                                                      {"TB", 1e12},
                                                      {"KIB", 1024},
                                                      {"MIB", 1024.0 * 1024},
                                                      {"GIB", 1024.0 * 1024 * 1024},
                                                      {"TIB", 1024.0 * 1024 * 1024 * 1024}};
  const auto it = units.find(unit);
  if (end == 0 || it == units.end()) return -1;
  char* stop = nullptr;
  const std::string number = text.substr(0, end);
  const double value = std::strtod(number.c_str(), &stop);
  if (stop != number.c_str() + number.size() || !std::isfinite(value)) return -1;
  return value * it->second;
}

std::string bytes_text(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  auto value = static_cast<double>(bytes);
  size_t unit = 0;
  while (unit + 1 < std::size(units) && (value >= 1024.0 || value <= -1024.0)) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return strprintf("%" PRId64 " B", bytes);
  return strprintf("%.1f %s", value, units[unit]);
}

}  // namespace trainer
