// The MLflow client's parts that need no server (tests/mlflow_check.py runs one): metric names
// and values from metrics records, a tracker whose server refuses connections, the credentials
// read as MLflow's Python client reads them and URLs masked wherever they are shown or stored.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include "config/config.h"
#include "config/loader.h"
#include "temp_dir.h"
#include "tracking/mlflow.h"
#include "tracking/mlflow_auth.h"
#include "util/net/url.h"
#include "util/strings.h"

namespace trainer::tracking {
namespace {

TEST(MlflowClient, RecordsBecomeMetricsNamedAsTensorBoardTags) {
  const nlohmann::json record = {{"split", "train"}, {"step", 12}, {"epoch", 1},
                                 {"loss", 0.5},      {"lr", 0.01}, {"bad_samples", 0},
                                 {"grad_norm", NAN}, {"note", "x"}};
  std::map<std::string, Metric> by_key;
  for (const auto& m : record_metrics(record, /*timestamp_ms=*/7)) by_key[m.key] = m;
  ASSERT_EQ(by_key.size(), 3u);  // the NaN, the text and the position fields left out
  EXPECT_EQ(by_key.at("train/loss").value, 0.5);
  EXPECT_EQ(by_key.at("train/loss").step, 12);
  EXPECT_EQ(by_key.at("train/loss").timestamp_ms, 7);
  EXPECT_EQ(by_key.at("lr").value, 0.01);
  EXPECT_EQ(by_key.at("train/bad_samples").value, 0.0);
  const auto val = record_metrics({{"split", "val_ema"}, {"step", 3}, {"top1", 0.25}}, 0);
  ASSERT_EQ(val.size(), 1u);
  EXPECT_EQ(val[0].key, "val_ema/top1");
}

// Nothing listens on the port: logging never waits, and finish() gives up after its wait.
TEST(MlflowClient, AServerThatRefusesConnectionsStallsNothing) {
  MlflowRunSpec spec;
  spec.uri = "http://127.0.0.1:9";  // discard: closed on test machines
  spec.experiment = "x";
  MlflowTracker tracker(spec, /*max_queued=*/4);
  for (int i = 0; i < 10; ++i) tracker.log({{"train/loss", 1.0, 0, i}});
  EXPECT_EQ(tracker.dropped(), 6);  // the queue keeps the newest 4
  tracker.finish("FINISHED", /*wait_s=*/0.2);
  EXPECT_EQ(tracker.run_id(), "");
}

TEST(Url, CredentialsAreMaskedAsPipShowsThem) {
  EXPECT_EQ(mask_url_credentials("http://alice:S3cret@host:5000"), "http://alice:***@host:5000");
  EXPECT_EQ(mask_url_credentials("https://tok3n@host/x"), "https://***@host/x");  // a token
  EXPECT_EQ(mask_url_credentials("http://host:5000/a"), "http://host:5000/a");
  EXPECT_EQ(mask_url_credentials("no url here: a@b"), "no url here: a@b");
  // Inside a text, every URL; an unencoded '/', '?' or '#' in the password is masked whole.
  EXPECT_EQ(mask_url_credentials("--set tracking.mlflow.uri=http://a:p/w?#x@h:1 and 'ftp://u:v@h'"),
            "--set tracking.mlflow.uri=http://a:***@h:1 and 'ftp://u:***@h'");
  EXPECT_EQ(mask_url_credentials("http://a@corp.com:pw@h"), "http://a@corp.com:***@h");
  // Masking twice changes nothing.
  for (const std::string url : {"http://alice:S3cret@h", "http://tok@h"}) {
    EXPECT_EQ(mask_url_credentials(mask_url_credentials(url)), mask_url_credentials(url));
  }
}

TEST(Url, PartsAndTheUrlWithoutCredentials) {
  const auto p = parse_url("https://al%40ce:p%3Aw@[::1]:8443/prefix?q=1");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->scheme, "https");
  EXPECT_EQ(percent_decode(p->user), "al@ce");
  EXPECT_EQ(percent_decode(p->password), "p:w");
  EXPECT_EQ(p->host, "[::1]");
  EXPECT_EQ(p->port, "8443");
  EXPECT_EQ(p->rest, "/prefix?q=1");
  EXPECT_FALSE(parse_url("127.0.0.1:5000"));
  EXPECT_EQ(url_without_credentials("http://a:b@h:5000/x"), "http://h:5000/x");
  EXPECT_EQ(url_without_credentials("http://h:5000"), "http://h:5000");
  EXPECT_TRUE(has_unencoded_user_info("http://a:p/w@h"));
  EXPECT_FALSE(has_unencoded_user_info("http://a:p%2Fw@h/x"));
}

// The environment as a map, for mlflow_server().
tracking::GetEnv env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

// As mlflow.utils.rest_utils: the URI's user-info (as the requests library applies it) before
// MLFLOW_TRACKING_USERNAME/PASSWORD before MLFLOW_TRACKING_TOKEN; a masked URI counts as none.
TEST(MlflowAuth, CredentialsComeAsMlflowsClientTakesThem) {
  const std::map<std::string, std::string> basic = {{"MLFLOW_TRACKING_USERNAME", "bob"},
                                                    {"MLFLOW_TRACKING_PASSWORD", "envpw"},
                                                    {"MLFLOW_TRACKING_TOKEN", "tok"}};
  auto s = tracking::mlflow_server("http://al%40ce:p%23w@host:5000/", env_of(basic));
  EXPECT_EQ(s.url, "http://host:5000");
  EXPECT_EQ(s.shown, "http://al%40ce:***@host:5000");
  EXPECT_EQ(s.auth.username, "al@ce");
  EXPECT_EQ(s.auth.password, "p#w");
  EXPECT_EQ(s.credentials_from, "the URI's user-info");

  s = tracking::mlflow_server("http://alice:***@host:5000", env_of(basic));  // a run dir's copy
  EXPECT_TRUE(s.masked_uri);
  EXPECT_EQ(s.url, "http://host:5000");
  EXPECT_EQ(s.auth.username, "bob");
  EXPECT_EQ(s.auth.password, "envpw");
  EXPECT_EQ(s.auth.bearer_token, "");

  s = tracking::mlflow_server("http://host:5000", env_of({{"MLFLOW_TRACKING_TOKEN", "tok"}}));
  EXPECT_EQ(s.auth.username, "");
  EXPECT_EQ(s.auth.bearer_token, "tok");
  EXPECT_EQ(s.credentials_from, "MLFLOW_TRACKING_TOKEN");

  s = tracking::mlflow_server("http://host:5000", env_of({}));
  EXPECT_EQ(s.credentials_from, "");
  EXPECT_FALSE(s.auth.insecure_tls);
}

TEST(MlflowAuth, TheCredentialsFileFillsWhatTheEnvironmentLacks) {
  test_support::TempDir home("mlflow_home");
  std::filesystem::create_directories(home.path() / ".mlflow");
  std::ofstream(home.path() / ".mlflow" / "credentials")
      << "[other]\nmlflow_tracking_username = nobody\n[mlflow]\n# comment\n"
         "mlflow_tracking_username = filebob\nmlflow_tracking_password: filepw\n";
  const std::string h = home.path().string();
  auto s = tracking::mlflow_server("http://host", env_of({{"HOME", h}}));
  EXPECT_EQ(s.auth.username, "filebob");
  EXPECT_EQ(s.auth.password, "filepw");
  s = tracking::mlflow_server("http://host",
                              env_of({{"HOME", h}, {"MLFLOW_TRACKING_PASSWORD", "envpw"}}));
  EXPECT_EQ(s.auth.username, "filebob");
  EXPECT_EQ(s.auth.password, "envpw");
}

// What MLflow's client refuses is a setup error naming the variable, never the secret.
TEST(MlflowAuth, AnEnvironmentThatCannotBeUsedIsRefused) {
  test_support::TempDir dir("mlflow_tls");
  const std::string ca = (dir.path() / "ca.pem").string();
  std::ofstream(ca) << "-----BEGIN CERTIFICATE-----\n";
  auto refused = [](const std::map<std::string, std::string>& vars, const std::string& names) {
    try {
      tracking::mlflow_server("https://host", env_of(vars));
    } catch (const tracking::MlflowSetupError& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos) << e.what();
      return true;
    }
    return false;
  };
  EXPECT_TRUE(refused({{"MLFLOW_TRACKING_USERNAME", "bob"}}, "MLFLOW_TRACKING_PASSWORD"));
  EXPECT_TRUE(refused({{"MLFLOW_TRACKING_PASSWORD", "s3cret"}}, "MLFLOW_TRACKING_USERNAME"));
  EXPECT_TRUE(refused({{"MLFLOW_TRACKING_INSECURE_TLS", "maybe"}}, "MLFLOW_TRACKING_INSECURE_TLS"));
  EXPECT_TRUE(
      refused({{"MLFLOW_TRACKING_INSECURE_TLS", "TRUE"}, {"MLFLOW_TRACKING_SERVER_CERT_PATH", ca}},
              "MLFLOW_TRACKING_SERVER_CERT_PATH"));
  EXPECT_TRUE(refused({{"MLFLOW_TRACKING_SERVER_CERT_PATH", ca + ".missing"}},
                      "MLFLOW_TRACKING_SERVER_CERT_PATH"));
  const auto s =
      tracking::mlflow_server("https://host", env_of({{"MLFLOW_TRACKING_INSECURE_TLS", "1"}}));
  EXPECT_TRUE(s.auth.insecure_tls);
  EXPECT_EQ(
      tracking::mlflow_server("https://host", env_of({{"MLFLOW_TRACKING_SERVER_CERT_PATH", ca}}))
          .auth.ca_bundle,
      ca);
}

// What the config prints and stores (config.yaml, MLflow's params, checkpoint metadata) masks the
// URI's password.
TEST(MlflowAuth, ThePrintedAndStoredConfigMasksThePassword) {
  config::Config cfg;
  cfg.tracking.mlflow.uri = "http://alice:S3cret@host:5000";
  const std::string yaml = config::to_yaml(cfg);
  EXPECT_EQ(yaml.find("S3cret"), std::string::npos);
  EXPECT_NE(yaml.find("http://alice:***@host:5000"), std::string::npos) << yaml;
  const auto value = config::lookup(cfg, "tracking.mlflow.uri");
  ASSERT_TRUE(value);
  EXPECT_EQ(*value, "http://alice:***@host:5000");
  for (const auto& [key, v] : config::flatten(cfg)) {
    EXPECT_EQ(v.find("S3cret"), std::string::npos) << key;
  }
}

TEST(Strings, SplitAndTrim) {
  EXPECT_EQ(split("a=1, b=2", ','), (std::vector<std::string>{"a=1", " b=2"}));
  EXPECT_TRUE(split("", ',').empty());
  EXPECT_EQ(split("x,", ','), (std::vector<std::string>{"x", ""}));
  EXPECT_EQ(trim(" \tb=2 "), "b=2");
  EXPECT_EQ(trim("   "), "");
}

}  // namespace
}  // namespace trainer::tracking
