// Where and as whom the MLflow client connects, read as MLflow's own Python client reads it: the
// tracking URI's user-info, then MLflow's environment variables and ~/.mlflow/credentials. The
// secrets stay in memory for the HTTP client; everything shown or stored uses `shown`.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

#include "util/net/http.h"

namespace trainer::tracking {

// An environment that cannot be used (a value MLflow's client rejects too); what() names the
// variable and how to fix it, never a secret.
class MlflowSetupError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct MlflowServer {
  std::string url;    // the URI without user-info or a trailing '/': where requests go
  std::string shown;  // the URI as logged and stored: its user-info masked (util/net/url.h)
  HttpAuth auth;      // the credentials and TLS settings
  // Where the credentials came from, for messages: "the URI's user-info",
  // "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"; "" = none.
  std::string credentials_from;
  bool masked_uri = false;  // the URI's user-info is a masked one (a run dir's config.yaml)
};

using GetEnv = std::function<const char*(const char*)>;

// The server of tracking URI `uri` with its credentials, as mlflow.utils.rest_utils does:
//   - user-info in the URI (http://user:password@host, percent-decoded) wins, as the requests
//     library lets it; a masked one ("user:***@") counts as none;
//   - else MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (each from the environment, else
//     from the [mlflow] section of $HOME/.mlflow/credentials): HTTP basic authentication;
//   - else MLFLOW_TRACKING_TOKEN: "Authorization: Bearer <token>";
//   - MLFLOW_TRACKING_INSECURE_TLS (true/false/1/0): https without verifying the certificate;
//     MLFLOW_TRACKING_SERVER_CERT_PATH: the CA bundle to verify it with (not both);
//     MLFLOW_TRACKING_CLIENT_CERT_PATH: a client certificate (PEM, with its key).
// Throws MlflowSetupError for a value that cannot be used: a username without a password or the
// other way round, INSECURE_TLS not a boolean or set with SERVER_CERT_PATH, a certificate path
// that is not a readable file.
MlflowServer mlflow_server(const std::string& uri, const GetEnv& getenv);

// mlflow_server() with the process's environment.
MlflowServer mlflow_server(const std::string& uri);

}  // namespace trainer::tracking
