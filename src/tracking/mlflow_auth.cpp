#include "tracking/mlflow_auth.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "util/net/url.h"
#include "util/strings.h"

namespace trainer::tracking {
namespace {

std::string env_text(const GetEnv& getenv, const char* name) {
  const char* v = getenv(name);
  return v ? v : "";
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The [mlflow] section of an INI file (Python's configparser: "key = value" or "key: value",
// keys in lower case, '#' and ';' comments); empty when the file is missing.
std::map<std::string, std::string> credentials_file(const std::string& path) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  bool section = false;
  for (std::string line; std::getline(in, line);) {
    line = trim(line);
    if (!line.empty() && line.back() == '\r') line = trim(line.substr(0, line.size() - 1));
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[') {
      section = line == "[mlflow]";
      continue;
    }
    const size_t eq = line.find_first_of("=:");
    if (section && eq != std::string::npos) {
      out[lower(trim(line.substr(0, eq)))] = trim(line.substr(eq + 1));
    }
  }
  return out;
}

bool env_flag(const GetEnv& getenv, const char* name) {
  const char* v = getenv(name);
  if (!v) return false;
  const std::string s = lower(v);
  if (s == "true" || s == "1") return true;
  if (s == "false" || s == "0") return false;
  throw MlflowSetupError(std::string(name) +
                         " must be true, false, 1 or 0 (as MLflow reads it), got '" + v + "'");
}

std::string readable_file(const GetEnv& getenv, const char* name) {
  const std::string path = env_text(getenv, name);
  if (path.empty()) return path;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec) || ::access(path.c_str(), R_OK) != 0) {
    throw MlflowSetupError(std::string(name) + "=" + path +
                           ": not a readable file; name a PEM file or unset it");
  }
  return path;
}

// Credentials from MLflow's environment variables (and its credentials file).
void credentials_from_env(const GetEnv& getenv, MlflowServer& s) {
  const char* home = getenv("HOME");
  const auto file = home ? credentials_file(std::string(home) + "/.mlflow/credentials")
                         : std::map<std::string, std::string>{};
  auto value = [&](const char* name) {
    const std::string v = env_text(getenv, name);
    if (!v.empty()) return v;
    const auto it = file.find(lower(name));
    return it == file.end() ? std::string() : it->second;
  };
  const std::string user = value("MLFLOW_TRACKING_USERNAME");
  const std::string password = value("MLFLOW_TRACKING_PASSWORD");
  const std::string token = env_text(getenv, "MLFLOW_TRACKING_TOKEN");
  if (!user.empty() && !password.empty()) {
    s.auth.username = user;
    s.auth.password = password;
    s.credentials_from = "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD";
  } else if (!token.empty()) {
    s.auth.bearer_token = token;
    s.credentials_from = "MLFLOW_TRACKING_TOKEN";
  } else if (!user.empty() || !password.empty()) {
    throw MlflowSetupError(
        std::string(user.empty()
                        ? "MLFLOW_TRACKING_PASSWORD is set but MLFLOW_TRACKING_USERNAME "
                        : "MLFLOW_TRACKING_USERNAME is set but MLFLOW_TRACKING_PASSWORD ") +
        "is not (nor in ~/.mlflow/credentials): HTTP basic authentication needs both; set the "
        "other, or unset it");
  }
}

}  // namespace

MlflowServer mlflow_server(const std::string& uri, const GetEnv& getenv) {
  MlflowServer s;
  s.url = url_without_credentials(uri);
  while (!s.url.empty() && s.url.back() == '/') s.url.pop_back();
  s.shown = mask_url_credentials(uri);
  while (!s.shown.empty() && s.shown.back() == '/') s.shown.pop_back();
  const auto parts = parse_url(uri);
  s.masked_uri = parts && parts->has_user_info &&
                 (parts->password == kMaskedSecret || parts->user == kMaskedSecret);
  if (parts && parts->has_user_info && !s.masked_uri) {
    s.auth.username = percent_decode(parts->user);
    s.auth.password = percent_decode(parts->password);
    s.credentials_from = "the URI's user-info";
  } else {
    credentials_from_env(getenv, s);
  }
  s.auth.insecure_tls = env_flag(getenv, "MLFLOW_TRACKING_INSECURE_TLS");
  s.auth.ca_bundle = readable_file(getenv, "MLFLOW_TRACKING_SERVER_CERT_PATH");
  s.auth.client_cert = readable_file(getenv, "MLFLOW_TRACKING_CLIENT_CERT_PATH");
  if (s.auth.insecure_tls && !s.auth.ca_bundle.empty()) {
    throw MlflowSetupError(
        "MLFLOW_TRACKING_INSECURE_TLS=true and MLFLOW_TRACKING_SERVER_CERT_PATH are both set: "
        "either verify the server's certificate with the CA bundle or not at all; unset one");
  }
  return s;
}

MlflowServer mlflow_server(const std::string& uri) {
  return mlflow_server(uri, [](const char* name) { return std::getenv(name); });
}

}  // namespace trainer::tracking
