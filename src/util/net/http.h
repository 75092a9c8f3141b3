// HTTP requests through libcurl, for the clients of web APIs (tracking/mlflow.h).
#pragma once

#include <atomic>
#include <optional>
#include <string>

namespace trainer {

struct HttpResponse {
  long status = 0;   // the HTTP status code
  std::string body;  // the response body
};

// How a request proves who sends it and checks whom it talks to. Secrets: never logged.
struct HttpAuth {
  std::string username, password;  // HTTP basic authentication, when username is not empty
  std::string bearer_token;        // "Authorization: Bearer ..." when no username is given
  bool insecure_tls = false;       // https: verify neither the certificate nor the host name
  std::string ca_bundle;           // https: the CA certificates to verify with; "" = the system's
  std::string client_cert;         // https: a PEM file with the client's certificate and key
};

// One request of `method` (GET, POST, PUT) to `url` with `body` (sent when not empty, as
// `content_type`), authenticated as `auth` says. Blocks for at most `timeout_s` seconds
// (connecting: at most 5). Returns the response whatever its status; nullopt, with `error`
// describing why, when none came (connection refused, timeout, a name that does not resolve, a
// certificate that does not verify). Follows no redirect. `cancel`, when given and set (by another
// thread), ends the request within about a second, as if it had timed out. Thread-safe.
std::optional<HttpResponse> http_request(const std::string& method, const std::string& url,
                                         const std::string& body, const std::string& content_type,
                                         double timeout_s, std::string& error,
                                         const HttpAuth& auth = {},
                                         const std::atomic<bool>* cancel = nullptr);

// `text` percent-encoded for a URL's query or path segment.
std::string url_encode(const std::string& text);

}  // namespace trainer
