// End-to-end: metrics beside metrics.jsonl (tracking.csv), profiler traces of training and of
// bench (profile:, bench --profile), runs with optim.lr 0, and tracking.mlflow's checks and
// credentials without a server (tests/mlflow_check.py and mlflow_auth_check.py run one).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli_fixture.h"

namespace {

namespace fs = std::filesystem;
using trainer::test_support::Cli;
using trainer::test_support::max_abs_diff;
using trainer::test_support::step_file;

std::vector<std::string> split_cells(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream in(line);
  for (std::string cell; std::getline(in, cell, ',');) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

// The cell a JSON value must have become: its JSON text, a string as it is.
std::string expected_cell(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// metrics.csv holds every record of metrics.jsonl, field for field, across a resume.
TEST_F(Cli, TrackingCsvHoldsTheRecordsOfMetricsJsonl) {
  const auto run_dir = dir_ / "run";
  const std::string args = "--config configs/synthetic.yaml --set tracking.csv=true --run-dir '" +
                           run_dir.string() + "'";
  ASSERT_EQ(run(args + " --set train.stop_at_step=20").code, 0);
  auto r = run(args + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;

  std::vector<nlohmann::json> records;
  std::ifstream jsonl(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(jsonl, line);) records.push_back(nlohmann::json::parse(line));
  std::ifstream csv(run_dir / "metrics.csv");
  std::string line;
  ASSERT_TRUE(std::getline(csv, line));
  const auto header = split_cells(line);
  ASSERT_GE(header.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(header.begin(), header.begin() + 3),
            (std::vector<std::string>{"split", "step", "epoch"}));
  size_t rows = 0;
  for (; std::getline(csv, line); ++rows) {
    ASSERT_LT(rows, records.size()) << "more rows than records";
    const auto cells = split_cells(line);
    ASSERT_EQ(cells.size(), header.size()) << line;
    const auto& record = records[rows];
    for (size_t c = 0; c < header.size(); ++c) {
      const auto it = record.find(header[c]);
      const std::string want = it == record.end() ? "" : expected_cell(*it);
      EXPECT_EQ(cells[c], want) << "row " << rows << ", column " << header[c];
    }
    for (const auto& [key, value] : record.items()) {
      if (value.is_primitive()) {
        EXPECT_NE(std::find(header.begin(), header.end(), key), header.end()) << key;
      }
    }
  }
  EXPECT_EQ(rows, records.size());
  EXPECT_GE(rows, 10u);  // 8 train records and 2 val records
}

// The names of a Chrome trace's complete events ("ph": "X"), with their counts.
std::map<std::string, int> trace_events(const fs::path& path) {
  std::map<std::string, int> out;
  const auto trace = nlohmann::json::parse(trainer::test_support::read_file(path));
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("ph", "") == "X") ++out[e.value("name", "")];
  }
  return out;
}

int aten_events(const std::map<std::string, int>& events) {
  int n = 0;
  for (const auto& [name, count] : events) n += name.rfind("aten::", 0) == 0 ? count : 0;
  return n;
}

// bench --profile: a Chrome trace with the ATen operators and the trainer's phases, and its count
// of top-level operators per step within 5% of the operator count bench makes without the
// profiler.
TEST_F(Cli, BenchProfileWritesATraceThatCountsBenchsOperators) {
  const auto dir = dir_ / "profile", json = dir_ / "bench.json";
  auto r =
      run("bench --config configs/synthetic.yaml --fixed-batch --steps 5 --warmup 2 "
          "--profile '" +
          dir.string() + "' --json '" + json.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto events = trace_events(dir / "rank_0.trace.json");
  EXPECT_GT(aten_events(events), 0);
  for (const char* phase : {"trainer::forward", "trainer::backward", "trainer::optimizer"}) {
    EXPECT_EQ(events.count(phase) ? events.at(phase) : 0, 3) << phase;  // 3 profiled steps
  }
  const auto b = nlohmann::json::parse(trainer::test_support::read_file(json));
  const double counted = b["ops_per_step"]["total"].get<double>();
  const double profiled = b["profile"]["ops_per_step"].get<double>();
  ASSERT_GT(counted, 0);
  EXPECT_NEAR(profiled / counted, 1.0, 0.05) << "profiled " << profiled << ", counted " << counted;
}

// profile.start_step: steps 2 to 4 of a training run under the profiler, their trace in the run
// dir and the operator table in train.log.
TEST_F(Cli, ProfileSectionRecordsAWindowOfTrainingSteps) {
  const auto run_dir = dir_ / "run";
  auto r =
      run("--config configs/synthetic.yaml --set train.max_steps=6 --set profile.start_step=2 "
          "--set profile.steps=3 --set profile.record_shapes=true --run-dir '" +
          run_dir.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto events = trace_events(run_dir / "profile" / "rank_0.trace.json");
  EXPECT_GT(aten_events(events), 0);
  for (const char* phase : {"trainer::forward", "trainer::backward", "trainer::optimizer"}) {
    EXPECT_EQ(events.count(phase) ? events.at(phase) : 0, 3) << phase;
  }
  const std::string log = trainer::test_support::read_file(run_dir / "train.log");
  EXPECT_NE(log.find("profiled steps 2 to 4"), std::string::npos) << log;
  EXPECT_NE(log.find("ATen operators (top level)"), std::string::npos) << log;
  // Without the section, no trace.
  r = run("--config configs/synthetic.yaml --set train.max_steps=2 --run-dir '" +
          (dir_ / "plain").string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "plain" / "profile"));
}

// optim.lr 0 is accepted and leaves the weights as they were initialised.
TEST_F(Cli, ALearningRateOfZeroLeavesTheWeights) {
  for (const std::string lr : {"0", "0.05"}) {
    SCOPED_TRACE("optim.lr " + lr);
    const auto run_dir = dir_ / ("lr" + lr);
    auto r = run("--config configs/synthetic.yaml --set optim.lr=" + lr +
                 " --set optim.momentum=0.9 --set optim.weight_decay=0.01 --set train.max_steps=3 "
                 "--set run.checkpoint_every=1 --set run.keep_last=3 --run-dir '" +
                 run_dir.string() + "'");
    ASSERT_EQ(r.code, 0) << r.err;
    const double moved = max_abs_diff(run_dir / "checkpoints" / step_file(1),
                                      run_dir / "checkpoints" / step_file(3), "model.");
    if (lr == "0") {
      EXPECT_EQ(moved, 0.0);
    } else {
      EXPECT_GT(moved, 0.0);
    }
  }
}

// Every file under `dir` (recursively) whose bytes hold `secret`.
std::vector<std::string> files_holding(const fs::path& dir, const std::string& secret) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() &&
        trainer::test_support::read_file(e.path()).find(secret) != std::string::npos) {
      out.push_back(e.path().string());
    }
  }
  return out;
}

// A password in tracking.mlflow.uri appears nowhere: not on the console, in train.log,
// config.yaml, the checkpoints' metadata or any other file of the run dir, nor in the line of a
// resume that says the URI changed; the masked URI does. (Nothing listens on port 9: the run
// trains on.)
TEST_F(Cli, AnMlflowPasswordIsMaskedEverywhereItIsShownOrStored) {
  const auto run_dir = dir_ / "run";
  const std::string args =
      "--config configs/synthetic.yaml --log-level info --set "
      "run.checkpoint_every=4 --run-dir '" +
      run_dir.string() + "'";
  auto r = run(args +
               " --set tracking.mlflow.uri=http://alice:S3cretPw@127.0.0.1:9 --set "
               "train.stop_at_step=4");
  ASSERT_EQ(r.code, 0) << r.err;
  std::string shown = r.out + r.err;
  r = run(args +
          " --set tracking.mlflow.uri=http://alice:S3cretPw@localhost:9 --set "
          "train.stop_at_step=8 --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  shown += r.out + r.err;
  EXPECT_NE(r.err.find("tracking.mlflow.uri changed: http://alice:***@127.0.0.1:9 -> "
                       "http://alice:***@localhost:9"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(shown.find("S3cretPw"), std::string::npos) << shown;
  EXPECT_EQ(files_holding(run_dir, "S3cretPw"), std::vector<std::string>{});
  for (const char* file : {"config.yaml", "checkpoints/step_00000004.safetensors"}) {
    EXPECT_NE(trainer::test_support::read_file(run_dir / file).find("http://alice:***@"),
              std::string::npos)
        << file;
  }
  // --print-config and a config error quoting the --set argument mask it too.
  r =
      run("--config configs/synthetic.yaml --set tracking.mlflow.uri=http://alice:S3cretPw@h:5000 "
          "--print-config");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("http://alice:***@h:5000"), std::string::npos) << r.out;
  r = run("--config configs/synthetic.yaml --set tracking.mlflow.url=http://alice:S3cretPw@h");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("alice:***@h"), std::string::npos) << r.err;
  EXPECT_EQ((r.out + r.err).find("S3cretPw"), std::string::npos) << r.err;
}

// What MLflow's server would refuse, and MLflow's environment variables that cannot be used, stop
// the run at start with one line naming the key (exit 2), never the password.
TEST_F(Cli, WhatAnMlflowServerWouldRefuseIsAConfigError) {
  const std::string base = "--config configs/synthetic.yaml --dry-run --set ";
  const std::string long_name(501, 'e');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"tracking.mlflow.uri=http://", "names no host"},
      {"tracking.mlflow.uri=http://alice:S3cretPw@127.0.0.1:99999",
       "port '99999' is not a TCP port"},
      {"tracking.mlflow.uri=http://alice:S3c/retPw@127.0.0.1:5000", "percent-encode"},
      {"tracking.mlflow.tags=team=a,team=b", "tag 'team' is given twice"},
      {"tracking.mlflow.tags=mlflow.runName=x", "tag 'mlflow.runName' is reserved"},
      {"tracking.mlflow.tags=a//b=1", "is not a plain path"},
      {"tracking.mlflow.experiment=" + long_name, "MLflow takes at most 500"},
  };
  for (const auto& [set, message] : cases) {
    SCOPED_TRACE(set.substr(0, 80));
    // The URI first: a case that sets it again overrides it.
    const auto r = run(base + "tracking.mlflow.uri=http://127.0.0.1:5000 --set '" + set + "'");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("S3c"), std::string::npos) << r.err;
  }
  for (const auto& [env, message] : std::vector<std::pair<std::string, std::string>>{
           {"MLFLOW_TRACKING_INSECURE_TLS=maybe", "MLFLOW_TRACKING_INSECURE_TLS must be"},
           {"MLFLOW_TRACKING_PASSWORD=S3cretPw", "MLFLOW_TRACKING_USERNAME is not"}}) {
    SCOPED_TRACE(env);
    const auto r =
        sh("env " + env + " \"$TRAINER\" " + base + "tracking.mlflow.uri=http://127.0.0.1:5000");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("S3cretPw"), std::string::npos) << r.err;
  }
}

}  // namespace
