// HTTP requests through libcurl, for the clients of web APIs (tracking/mlflow.h).
#pragma once

#include <optional>
#include <string>

namespace trainer {

struct HttpResponse {
  long status = 0;   // the HTTP status code
  std::string body;  // the response body
};

// One request of `method` (GET, POST, PUT) to `url` with `body` (sent when not empty, as
// `content_type`). Blocks for at most `timeout_s` seconds (connecting: at most 5). Returns the
// response whatever its status; nullopt, with `error` describing why, when none came
// (connection refused, timeout, a name that does not resolve). Thread-safe.
std::optional<HttpResponse> http_request(const std::string& method, const std::string& url,
                                         const std::string& body, const std::string& content_type,
                                         double timeout_s, std::string& error);

// `text` percent-encoded for a URL's query or path segment.
std::string url_encode(const std::string& text);

}  // namespace trainer
