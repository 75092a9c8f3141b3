#include "tracking/mlflow.h"

#include <chrono>
#include <cmath>

#include "util/fileio.h"
#include "util/format.h"
#include "util/log.h"
#include "util/net/http.h"
#include "util/net/net.h"
#include "util/net/url.h"
#include "util/strings.h"

namespace trainer::tracking {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMetricsPerBatch = 1000;  // MLflow's limits per log-batch request
constexpr size_t kParamsPerBatch = 100;
constexpr size_t kParamValueMax = 6000;
constexpr double kRequestTimeoutS = 5.0;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json key_values(const KeyValues& kv, size_t value_max = std::string::npos) {
  json out = json::array();
  for (const auto& [k, v] : kv) out.push_back({{"key", k}, {"value", v.substr(0, value_max)}});
  return out;
}

}  // namespace

MlflowTracker::MlflowTracker(MlflowRunSpec spec, size_t max_queued)
    : spec_(std::move(spec)), server_(mlflow_server(spec_.uri)), max_queued_(max_queued) {
  const auto parts = parse_url(server_.url);
  if (!server_.credentials_from.empty() && parts && parts->scheme == "http" &&
      !is_loopback(parts->host == "[::1]" ? "::1" : parts->host)) {
    log::warn("MLflow at " + server_.shown + ": the credentials from " + server_.credentials_from +
              " go unencrypted over http://; use https://");
  }
  resumed_ = !spec_.run_id.empty();
  thread_ = std::thread([this] { work(); });
}

MlflowTracker::~MlflowTracker() {
  finish("FAILED");
}

void MlflowTracker::log(std::vector<Metric> metrics) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& m : metrics) {
    if (metrics_.size() >= max_queued_) {
      metrics_.pop_front();
      ++front_seq_;
      ++dropped_;
    }
    metrics_.push_back(std::move(m));
  }
  wake_.notify_one();
}

void MlflowTracker::set_tag(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  tags_.emplace_back(key, value);
  wake_.notify_one();
}

void MlflowTracker::finish(const std::string& status, double wait_s) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!thread_.joinable()) return;
    if (!status_) status_ = status;
    wake_.notify_one();
    // The background thread sends what is queued, then the status.
    wake_.wait_for(lock, std::chrono::duration<double>(wait_s), [this] { return status_sent_; });
    stopping_ = true;
    cancel_ = true;  // a request still waiting for the server ends now
    if (!status_sent_) {
      const std::string why =
          rejected_ ? "the server rejected the run's requests (" + problem_ + ")"
          : problem_.empty()
              ? "no answer within " + format_number(wait_s) + " s at the end of the run"
              : "not reachable at the end of the run (" + problem_ + ")";
      log::warn("MLflow at " + server_.shown + ": " + why + "; " + std::to_string(metrics_.size()) +
                " metrics and the run's status were not sent (metrics.jsonl has them)");
    }
    wake_.notify_one();
  }
  thread_.join();
}

std::string MlflowTracker::run_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return run_id_;
}

int64_t MlflowTracker::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void MlflowTracker::work() {
  double backoff_s = 0.25;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) return;
      wake_.wait_for(lock, std::chrono::seconds(1), [this] {
        return stopping_ || !metrics_.empty() || !tags_.empty() || (status_ && !status_sent_);
      });
      if (stopping_) return;
    }
    bool ok = false;
    try {
      ok = ensure_run() && send_batch() && send_status();
    } catch (const json::exception& e) {  // a reply that is not MLflow's
      failed(std::string("an unexpected reply: ") + e.what(), /*answered=*/true);
    }
    if (ok) {
      if (failing_) {
        log::info("MLflow at " + server_.shown + " answers again; sending what was queued");
        failing_ = false;
        std::lock_guard<std::mutex> lock(mu_);
        problem_.clear();
        rejected_ = false;
      }
      backoff_s = 0.25;
      continue;
    }
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_for(lock, std::chrono::duration<double>(backoff_s), [this] { return stopping_; });
    backoff_s = std::min(backoff_s * 2.0, 4.0);
  }
}

bool MlflowTracker::ensure_run() {
  if (resumed_ && run_id().empty() && !continue_run()) return false;
  if (resumed_) return read_logged_steps();
  return ensure_experiment() && create_run() && send_params() && send_artifacts();
}

bool MlflowTracker::continue_run() {
  json body = {{"run_id", spec_.run_id}, {"status", "RUNNING"}};
  if (!call("POST", "runs/update", body.dump())) {
    if (missing_) {  // the server no longer has it (another database)
      log::info("MLflow: the run " + spec_.run_id + " to continue is not on " + server_.shown +
                "; starting a new one");
      resumed_ = false;
    }
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  run_id_ = spec_.run_id;
  spec_.params.clear();  // logged by the run this one continues
  spec_.artifacts.clear();
  return true;
}

bool MlflowTracker::read_logged_steps() {
  if (steps_read_) return true;
  const auto got = call("GET", "runs/get?run_id=" + url_encode(spec_.run_id), "");
  if (!got) return false;
  int64_t newest = -1;
  const json data = json::parse(*got).at("run").value("data", json::object());
  for (const auto& m : data.value("metrics", json::array())) {
    const int64_t step = m.value("step", int64_t{0});
    logged_steps_[m.at("key").get<std::string>()] = step;
    newest = std::max(newest, step);
  }
  steps_read_ = true;
  if (newest >= 0) {
    log::info("MLflow: run " + spec_.run_id + " holds metrics up to step " +
              std::to_string(newest) +
              "; steps redone since the checkpoint are not logged to it again");
  }
  return true;
}

bool MlflowTracker::ensure_experiment() {
  if (!experiment_id_.empty()) return true;
  const auto found =
      call("GET", "experiments/get-by-name?experiment_name=" + url_encode(spec_.experiment), "");
  if (found) {
    experiment_id_ = json::parse(*found).at("experiment").at("experiment_id").get<std::string>();
    return true;
  }
  if (!missing_) return false;  // no answer: the server is down, nothing to create yet
  const auto made = call("POST", "experiments/create", json{{"name", spec_.experiment}}.dump());
  if (!made) return false;
  experiment_id_ = json::parse(*made).at("experiment_id").get<std::string>();
  return true;
}

bool MlflowTracker::create_run() {
  if (!run_id().empty()) return true;
  json body = {{"experiment_id", experiment_id_},
               {"run_name", spec_.run_name},
               {"start_time", now_ms()},
               {"tags", key_values(spec_.tags)}};
  const auto made = call("POST", "runs/create", body.dump());
  if (!made) return false;
  const auto info = json::parse(*made).at("run").at("info");
  artifact_uri_ = info.value("artifact_uri", "");
  const std::string id = info.at("run_id").get<std::string>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    run_id_ = id;
  }
  if (spec_.on_run_id) spec_.on_run_id(id);
  log::info("MLflow: run " + id + " in experiment '" + spec_.experiment + "' at " + server_.shown);
  return true;
}

bool MlflowTracker::send_params() {
  while (!spec_.params.empty()) {
    const size_t n = std::min(kParamsPerBatch, spec_.params.size());
    const KeyValues batch(spec_.params.begin(), spec_.params.begin() + n);
    json body = {{"run_id", run_id()}, {"params", key_values(batch, kParamValueMax)}};
    if (!call("POST", "runs/log-batch", body.dump())) return false;
    spec_.params.erase(spec_.params.begin(), spec_.params.begin() + n);
  }
  return true;
}

bool MlflowTracker::send_artifacts() {
  constexpr const char* kProxied = "mlflow-artifacts:";
  while (!spec_.artifacts.empty()) {
    const auto& [file, name] = spec_.artifacts.front();
    if (artifact_uri_.rfind(kProxied, 0) == 0) {
      std::string bytes;
      try {
        const auto read = read_bytes(file);
        bytes.assign(read.begin(), read.end());
      } catch (const IoError& e) {
        log::warn("MLflow: " + name + " not uploaded: " + e.what());
        spec_.artifacts.erase(spec_.artifacts.begin());
        continue;
      }
      std::string where = artifact_uri_.substr(std::string(kProxied).size());
      while (!where.empty() && where.front() == '/') where.erase(0, 1);
      const std::string url = "/api/2.0/mlflow-artifacts/artifacts/" + where + "/" + name;
      if (!call("PUT", url, bytes, "application/octet-stream")) return false;
    } else {
      log::info("MLflow: " + name + " not uploaded (the run's artifact store " + artifact_uri_ +
                " is not served by the tracking server); the run's tags name the run dir");
    }
    spec_.artifacts.erase(spec_.artifacts.begin());
  }
  return true;
}

bool MlflowTracker::send_batch() {
  for (;;) {
    std::vector<Metric> metrics;
    KeyValues tags;
    int64_t first = 0;  // the sequence number of metrics[0]
    {
      std::lock_guard<std::mutex> lock(mu_);
      first = front_seq_;
      const size_t n = std::min(kMetricsPerBatch, metrics_.size());
      metrics.assign(metrics_.begin(), metrics_.begin() + static_cast<std::ptrdiff_t>(n));
      tags = tags_;
    }
    if (metrics.empty() && tags.empty()) return true;
    json m = json::array();
    for (const auto& x : metrics) {
      const auto logged = logged_steps_.find(x.key);  // a resumed run's redone steps: once only
      if (logged != logged_steps_.end() && x.step <= logged->second) continue;
      m.push_back(
          {{"key", x.key}, {"value", x.value}, {"timestamp", x.timestamp_ms}, {"step", x.step}});
    }
    json body = {{"run_id", run_id()}, {"metrics", m}, {"tags", key_values(tags)}};
    if ((!m.empty() || !tags.empty()) && !call("POST", "runs/log-batch", body.dump())) {
      return false;
    }
    std::lock_guard<std::mutex> lock(mu_);
    // What was sent leaves the queue, less what a full queue dropped meanwhile.
    const int64_t end = first + static_cast<int64_t>(metrics.size());
    const size_t gone =
        std::min(static_cast<size_t>(std::max<int64_t>(end - front_seq_, 0)), metrics_.size());
    metrics_.erase(metrics_.begin(), metrics_.begin() + static_cast<std::ptrdiff_t>(gone));
    front_seq_ += static_cast<int64_t>(gone);
    tags_.erase(tags_.begin(), tags_.begin() + static_cast<std::ptrdiff_t>(tags.size()));
  }
}

bool MlflowTracker::send_status() {
  std::string status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!status_ || status_sent_ || !metrics_.empty() || !tags_.empty()) return true;
    status = *status_;
  }
  json body = {{"run_id", run_id()}, {"status", status}, {"end_time", now_ms()}};
  if (!call("POST", "runs/update", body.dump())) return false;
  std::lock_guard<std::mutex> lock(mu_);
  status_sent_ = true;
  wake_.notify_all();
  return true;
}

std::optional<std::string> MlflowTracker::call(const std::string& method, const std::string& path,
                                               const std::string& body,
                                               const std::string& content_type) {
  const std::string url = server_.url + (path.front() == '/' ? path : "/api/2.0/mlflow/" + path);
  std::string error;
  const auto reply = http_request(method, url, body, content_type, kRequestTimeoutS, error,
                                  server_.auth, &cancel_);
  if (!reply) {
    failed(error, /*answered=*/false);
    return std::nullopt;
  }
  missing_ =
      reply->status != 200 && reply->body.find("RESOURCE_DOES_NOT_EXIST") != std::string::npos;
  if (reply->status != 200) {
    if (missing_) return std::nullopt;  // an answer (a missing experiment), not a failure
    failed(rejection(reply->status, path, reply->body), /*answered=*/true);
    return std::nullopt;
  }
  if (!reply->body.empty() && !json::accept(reply->body)) {  // a proxy's page, not MLflow's API
    failed("HTTP 200 from " + path + " is not MLflow's JSON reply (" +
               first_line(reply->body.substr(0, 100)) + "); is the URI the tracking server's?",
           /*answered=*/true);
    return std::nullopt;
  }
  return reply->body;
}

std::string MlflowTracker::rejection(long status, const std::string& path,
                                     const std::string& body) const {
  std::string what = "HTTP " + std::to_string(status) + " from " + path;
  if (status == 401 || status == 403) {
    if (!server_.credentials_from.empty()) {
      return what + ": the server refused the credentials from " + server_.credentials_from;
    }
    return what + ": the server wants credentials" +
           (server_.masked_uri ? " (the URI's password is masked, as a run dir's config.yaml "
                                 "stores it)"
                               : "") +
           "; set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN";
  }
  const auto reply = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (reply.is_object() && reply.contains("message")) {  // MLflow's error: {error_code, message}
    return what + ": " + reply.value("error_code", "") + ": " +
           reply["message"].dump().substr(0, 500);
  }
  return what + ": " + first_line(body.substr(0, 300));
}

void MlflowTracker::failed(const std::string& what, bool answered) {
  const std::string shown = mask_url_credentials(what);
  if (!failing_) {
    log::warn("MLflow at " + server_.shown + ": " + shown +
              "; retrying in the background (training goes on; metrics.jsonl has every record)");
  }
  failing_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  problem_ = shown;
  rejected_ = answered;
}

std::vector<Metric> record_metrics(const nlohmann::json& record, int64_t timestamp_ms) {
  std::vector<Metric> out;
  const std::string split = record.value("split", "");
  const int64_t step = record.value("step", int64_t{0});
  for (const auto& [key, value] : record.items()) {
    if (key == "split" || key == "step" || key == "epoch" || !value.is_number()) continue;
    const double v = value.get<double>();
    if (!std::isfinite(v)) continue;
    out.push_back({key == "lr" ? key : split + "/" + key, v, timestamp_ms, step});
  }
  return out;
}

}  // namespace trainer::tracking
