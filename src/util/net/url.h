// URLs with credentials: their parts, the URL without its user-info (what a client requests) and
// the text with every password masked (what is shown or stored). Torch-free.
#pragma once

#include <optional>
#include <string>

namespace trainer {

// What a masked secret reads as: http://alice:***@host:5000.
inline constexpr const char* kMaskedSecret = "***";

// The parts of scheme://[user[:password]@]host[:port][/path?query#fragment], as written (still
// percent-encoded). The authority ends at the first '/', '?' or '#' after "://" (RFC 3986).
struct UrlParts {
  std::string scheme;  // "http"
  bool has_user_info = false;
  std::string user;  // before the first ':' of the user-info
  bool has_password = false;
  std::string password;  // after it
  std::string host;      // a name, an IPv4 address or a bracketed IPv6 address ("[::1]")
  std::string port;      // the digits after the host's ':'; "" when none
  std::string rest;      // from the path on ("" or "/...")
};

// `url` split into its parts; nullopt when it has no "scheme://".
std::optional<UrlParts> parse_url(const std::string& url);

// `url` without its user-info ("http://alice:pw@host:5000/x" -> "http://host:5000/x"); `url`
// unchanged when it has none or is no URL.
std::string url_without_credentials(const std::string& url);

// `text` with the user-info of every URL in it masked, as pip and git show them:
// "scheme://user:***@host" where a password is given, "scheme://***@host" where only a user (often
// a token) is. A URL ends at white space or a quote; its user-info runs to the last '@' before
// that, so that a password holding an unencoded '/', '?' or '#' is masked whole too.
std::string mask_url_credentials(const std::string& text);

// Whether `url`'s user-info holds characters that end a URL's authority ('/', '?', '#') before
// its '@': such a password must be percent-encoded (%2F, %3F, %23) to be read as one.
bool has_unencoded_user_info(const std::string& url);

// `text` with its %XX escapes decoded (a '+' stays a '+').
std::string percent_decode(const std::string& text);

}  // namespace trainer
