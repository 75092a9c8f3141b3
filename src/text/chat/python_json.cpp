#include "text/chat/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace trainer::data {
namespace {

void quote_into(std::string_view text, std::string& out) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escape[8];
          std::snprintf(escape, sizeof escape, "\\u%04x", static_cast<unsigned char>(c));
          out += escape;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void newline(std::string& out, int indent, int depth) {
  out += '\n';
  out.append(static_cast<size_t>(indent) * static_cast<size_t>(depth), ' ');
}

void dump_into(const nlohmann::ordered_json& v, int indent, int depth, std::string& out) {
  using T = nlohmann::ordered_json::value_t;
  const char* const item_separator = indent < 0 ? ", " : ",";
  switch (v.type()) {
    case T::object: {
      if (v.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += item_separator;
        first = false;
        if (indent >= 0) newline(out, indent, depth + 1);
        quote_into(key, out);
        out += ": ";
        dump_into(item, indent, depth + 1, out);
      }
      if (indent >= 0) newline(out, indent, depth);
      out += '}';
      return;
    }
    case T::array: {
      if (v.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) out += item_separator;
        if (indent >= 0) newline(out, indent, depth + 1);
        dump_into(v[i], indent, depth + 1, out);
      }
      if (indent >= 0) newline(out, indent, depth);
      out += ']';
      return;
    }
    case T::string:
      quote_into(v.get_ref<const std::string&>(), out);
      return;
    case T::boolean:
      out += v.get<bool>() ? "true" : "false";
      return;
    case T::number_integer:
      out += std::to_string(v.get<int64_t>());
      return;
    case T::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      return;
    case T::number_float:
      out += python_float_repr(v.get<double>());
      return;
    default:  // null (and the binary and discarded values JSON text does not produce)
      out += "null";
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value, int indent) {
  std::string out;
  dump_into(value, indent, 0, out);
  return out;
}

std::string python_json_quote(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  quote_into(text, out);
  return out;
}

std::string python_float_repr(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";  // as json.dumps writes them
  // The shortest digits that read back as x, as d.ddde±X; Python's repr writes them fixed for
  // exponents -4 to 15 and in exponent form otherwise.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  const std::string_view s(buf, static_cast<size_t>(r.ptr - buf));
  const size_t e = s.find('e');
  const bool negative = s[0] == '-';
  std::string digits;
  for (const char c : s.substr(negative ? 1 : 0, e - (negative ? 1 : 0))) {
    if (c != '.') digits += c;
  }
  const int exponent = std::atoi(std::string(s.substr(e + 1)).c_str());
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char tail[16];
    std::snprintf(tail, sizeof tail, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + tail;
  }
  const int point = exponent + 1;  // digits before the decimal point
  if (point <= 0) return out + "0." + std::string(static_cast<size_t>(-point), '0') + digits;
  if (static_cast<size_t>(point) >= digits.size()) {
    return out + digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, static_cast<size_t>(point)) + "." +
         digits.substr(static_cast<size_t>(point));
}

}  // namespace trainer::data
