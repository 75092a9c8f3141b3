// MLflow tracking through its REST API (https://mlflow.org/docs/latest/rest-api.html): a run in
// an experiment, its parameters and tags, metrics in batches, artifacts and the final status.
//
// Nothing the training thread calls waits for the server: requests go out on a background
// thread from a bounded queue, retried with back-off while the server is down or slow. The first
// failure is logged once (a warning naming the server); the records queued meanwhile go out
// when it answers again (logged too). A full queue drops its oldest metrics, counted.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tracking/mlflow_auth.h"

namespace trainer::tracking {

using KeyValues = std::vector<std::pair<std::string, std::string>>;

// What a run tells MLflow about itself.
struct MlflowRunSpec {
  // The tracking server: http(s)://[user:password@]host:port. Its credentials (or those of
  // MLflow's environment variables, tracking/mlflow_auth.h) go to the server only; every message
  // shows it masked.
  std::string uri;
  std::string experiment;  // its name; created when missing
  std::string run_name;
  std::string run_id;   // not empty: continue this run (set back to RUNNING), logging no params
  KeyValues params;     // a new run's parameters (values cut to MLflow's 6000 characters)
  KeyValues tags;       // a new run's tags
  KeyValues artifacts;  // (local file, artifact name): uploaded once the run exists
  // Told the run's id once the server made it (on the background thread).
  std::function<void(const std::string&)> on_run_id;
};

struct Metric {
  std::string key;
  double value = 0.0;  // finite
  int64_t timestamp_ms = 0;
  int64_t step = 0;
};

class MlflowTracker {
 public:
  // Starts the background thread, which creates (or continues) the run; returns at once.
  // Throws MlflowSetupError when MLflow's environment variables cannot be used.
  explicit MlflowTracker(MlflowRunSpec spec, size_t max_queued = 100000);
  // Ends the run as FAILED unless finish() was called, waiting as finish() does.
  ~MlflowTracker();
  MlflowTracker(const MlflowTracker&) = delete;
  MlflowTracker& operator=(const MlflowTracker&) = delete;

  // Queues metrics; never waits for the server.
  void log(std::vector<Metric> metrics);
  // Queues a tag of the run; never waits for the server.
  void set_tag(const std::string& key, const std::string& value);
  // Ends the run with `status` (FINISHED, FAILED or KILLED) after what is queued, waiting at most
  // `wait_s` seconds for the server; what it could not send by then is logged as lost.
  void finish(const std::string& status, double wait_s = 10.0);

  // The run's id; "" until the server made it.
  std::string run_id() const;
  // Metrics dropped because the queue was full.
  int64_t dropped() const;

 private:
  void work();
  // The steps of getting a run, each done once: the experiment, the run (or its status back to
  // RUNNING), its parameters, its artifacts (spec_'s params and artifacts are emptied as they go
  // out). False while the server fails.
  bool ensure_run();
  bool continue_run();  // spec_.run_id back to RUNNING
  // The newest step of each metric the continued run holds (logged before a restart): the steps
  // redone since the checkpoint are not logged again, so that its history matches metrics.jsonl.
  bool read_logged_steps();
  bool ensure_experiment();
  bool create_run();
  bool send_params();
  bool send_artifacts();
  // Sends up to 1000 queued metrics and the queued tags; false when the server failed.
  bool send_batch();
  bool send_status();
  // POSTs (or GETs, PUTs) `body` to `path` of the REST API; the reply's JSON when the server
  // answered 200 with JSON, else nullopt (the first failure of a stretch logged as a warning; an
  // answer that the resource does not exist sets missing_ instead).
  std::optional<std::string> call(const std::string& method, const std::string& path,
                                  const std::string& body,
                                  const std::string& content_type = "application/json");
  // What an answer other than 200 says: the status, the path and MLflow's error (or what to do
  // about credentials). Never a secret.
  std::string rejection(long status, const std::string& path, const std::string& body) const;
  // Records a failed request (`answered`: the server answered, refusing it), warning once a
  // stretch.
  void failed(const std::string& what, bool answered);

  MlflowRunSpec spec_;
  MlflowServer server_;  // where requests go, as whom; how the server is shown
  size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Metric> metrics_;         // guarded by mu_
  KeyValues tags_;                     // guarded by mu_
  std::optional<std::string> status_;  // guarded by mu_: the final status once asked for
  bool status_sent_ = false;           // guarded by mu_
  bool stopping_ = false;              // guarded by mu_
  int64_t dropped_ = 0;                // guarded by mu_
  int64_t front_seq_ = 0;              // guarded by mu_: the sequence number of metrics_.front()
  std::string run_id_;                 // guarded by mu_
  std::string problem_;                // guarded by mu_: the last failure, as logged
  bool rejected_ = false;              // guarded by mu_: ... was the server's refusal
  // The background thread's own.
  std::string experiment_id_, artifact_uri_;
  bool resumed_ = false;     // continuing spec_.run_id (until the server says it has no such run)
  bool steps_read_ = false;  // read_logged_steps() done
  std::map<std::string, int64_t> logged_steps_;  // metric key -> the newest step the run holds
  bool failing_ = false;             // the last request failed (warned once per stretch)
  bool missing_ = false;             // the last request's answer: the resource does not exist
  std::atomic<bool> cancel_{false};  // set when finish() stops waiting: ends a request in flight
  std::thread thread_;
};

// Every numeric field of a metrics record ({"split", "step", ...}) as an MLflow metric named as
// TensorBoard's tags are ("<split>/<field>", the learning rate "lr"); non-finite values are left
// out.
std::vector<Metric> record_metrics(const nlohmann::json& record, int64_t timestamp_ms);

}  // namespace trainer::tracking
