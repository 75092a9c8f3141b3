#include "util/net/url.h"

#include <cctype>
#include <cstring>

namespace trainer {
namespace {

bool is_scheme(const std::string& s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (!std::isalnum(c) && !std::strchr("+.-", c)) return false;
  }
  return true;
}

// Where the URL (or word) starting at `from` ends: white space, a quote or an angle bracket.
size_t token_end(const std::string& text, size_t from) {
  size_t end = from;
  while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end])) &&
         !std::strchr("\"'<>", text[end])) {
    ++end;
  }
  return end;
}

// The last '@' in [from, end) of `text`; npos when none.
size_t last_at(const std::string& text, size_t from, size_t end) {
  for (size_t i = end; i > from; --i) {
    if (text[i - 1] == '@') return i - 1;
  }
  return std::string::npos;
}

int hex_value(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

void split_host_port(const std::string& hostport, UrlParts& out) {
  if (!hostport.empty() && hostport.front() == '[') {
    const size_t close = hostport.find(']');
    if (close != std::string::npos &&
        (close + 1 == hostport.size() || hostport[close + 1] == ':')) {
      out.host = hostport.substr(0, close + 1);
      if (close + 1 < hostport.size()) out.port = hostport.substr(close + 2);
      return;
    }
    out.host = hostport;  // malformed: left whole for the caller to reject
    return;
  }
  const size_t colon = hostport.rfind(':');
  out.host = hostport.substr(0, colon);
  if (colon != std::string::npos) out.port = hostport.substr(colon + 1);
}

}  // namespace

std::optional<UrlParts> parse_url(const std::string& url) {
  const size_t sep = url.find("://");
  if (sep == std::string::npos || !is_scheme(url.substr(0, sep))) return std::nullopt;
  UrlParts out;
  out.scheme = url.substr(0, sep);
  const size_t start = sep + 3;
  size_t end = url.find_first_of("/?#", start);
  if (end == std::string::npos) end = url.size();
  out.rest = url.substr(end);
  std::string authority = url.substr(start, end - start);
  const size_t at = authority.rfind('@');
  if (at != std::string::npos) {
    const std::string info = authority.substr(0, at);
    out.has_user_info = true;
    const size_t colon = info.find(':');
    out.user = info.substr(0, colon);
    if (colon != std::string::npos) {
      out.has_password = true;
      out.password = info.substr(colon + 1);
    }
    authority.erase(0, at + 1);
  }
  split_host_port(authority, out);
  return out;
}

std::string url_without_credentials(const std::string& url) {
  const size_t sep = url.find("://");
  if (!parse_url(url)) return url;
  const size_t start = sep + 3;
  size_t end = url.find_first_of("/?#", start);
  if (end == std::string::npos) end = url.size();
  const size_t at = last_at(url, start, end);
  if (at == std::string::npos) return url;
  return url.substr(0, start) + url.substr(at + 1);
}

std::string mask_url_credentials(const std::string& text) {
  std::string out;
  size_t done = 0;  // text[0, done) is in `out`
  for (;;) {
    const size_t sep = text.find("://", done);
    if (sep == std::string::npos) break;
    const size_t start = sep + 3;
    const size_t end = token_end(text, start);
    const size_t at = last_at(text, start, end);
    if (at != std::string::npos) {
      const std::string info = text.substr(start, at - start);
      const size_t colon = info.find(':');
      out += text.substr(done, start - done);
      out += colon == std::string::npos ? kMaskedSecret : info.substr(0, colon + 1) + kMaskedSecret;
      out += text.substr(at, end - at);
    } else {
      out += text.substr(done, end - done);
    }
    done = end;
  }
  return out + text.substr(done);
}

bool has_unencoded_user_info(const std::string& url) {
  const size_t sep = url.find("://");
  if (sep == std::string::npos) return false;
  const size_t start = sep + 3;
  const size_t at = last_at(url, start, token_end(url, start));
  return at != std::string::npos && url.find_first_of("/?#", start) < at;
}

std::string percent_decode(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size()) {
      const int hi = hex_value(text[i + 1]), lo = hex_value(text[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += text[i];
  }
  return out;
}

}  // namespace trainer
