#include "util/net/http.h"

#include <curl/curl.h>

#include <memory>
#include <mutex>

namespace trainer {
namespace {

size_t append_body(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// libcurl's progress callback (at least once a second): non-zero aborts the transfer.
int check_cancel(void* cancel, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<const std::atomic<bool>*>(cancel)->load() ? 1 : 0;
}

void set_auth(CURL* c, const HttpAuth& auth) {
  if (!auth.username.empty()) {
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, static_cast<long>(CURLAUTH_BASIC));
    curl_easy_setopt(c, CURLOPT_USERNAME, auth.username.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, auth.password.c_str());
  } else if (!auth.bearer_token.empty()) {
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, static_cast<long>(CURLAUTH_BEARER));
    curl_easy_setopt(c, CURLOPT_XOAUTH2_BEARER, auth.bearer_token.c_str());
  }
  if (auth.insecure_tls) {
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!auth.ca_bundle.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, auth.ca_bundle.c_str());
  if (!auth.client_cert.empty()) {
    curl_easy_setopt(c, CURLOPT_SSLCERT, auth.client_cert.c_str());
    curl_easy_setopt(c, CURLOPT_SSLKEY, auth.client_cert.c_str());
  }
}

}  // namespace

std::optional<HttpResponse> http_request(const std::string& method, const std::string& url,
                                         const std::string& body, const std::string& content_type,
                                         double timeout_s, std::string& error, const HttpAuth& auth,
                                         const std::atomic<bool>* cancel) {
  global_init();
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), curl_easy_cleanup);
  if (!curl) {
    error = "libcurl could not start a request";
    return std::nullopt;
  }
  HttpResponse response;
  char message[CURL_ERROR_SIZE] = "";
  curl_slist* headers = nullptr;
  if (!body.empty())
    headers = curl_slist_append(headers, ("Content-Type: " + content_type).c_str());
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> header_list(headers, curl_slist_free_all);
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (!body.empty() || method != "GET") {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &response.body);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, message);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_s * 1000.0));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM from the resolver's timeout
  set_auth(c, auth);
  if (cancel) {
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, check_cancel);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, cancel);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  }
  const CURLcode rc = curl_easy_perform(c);
  if (rc == CURLE_ABORTED_BY_CALLBACK) {
    error = "the request was cancelled";
    return std::nullopt;
  }
  if (rc != CURLE_OK) {
    error = message[0] != '\0' ? message : curl_easy_strerror(rc);
    return std::nullopt;
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

std::string url_encode(const std::string& text) {
  global_init();
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), curl_easy_cleanup);
  char* encoded = curl_easy_escape(curl.get(), text.data(), static_cast<int>(text.size()));
  std::string out = encoded ? encoded : "";
  curl_free(encoded);
  return out;
}

}  // namespace trainer
