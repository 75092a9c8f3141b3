// The MLflow client's parts that need no server (tests/mlflow_check.py runs one): metric names
// and values from metrics records, a tracker whose server refuses connections.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "tracking/mlflow.h"
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

TEST(Strings, SplitAndTrim) {
  EXPECT_EQ(split("a=1, b=2", ','), (std::vector<std::string>{"a=1", " b=2"}));
  EXPECT_TRUE(split("", ',').empty());
  EXPECT_EQ(split("x,", ','), (std::vector<std::string>{"x", ""}));
  EXPECT_EQ(trim(" \tb=2 "), "b=2");
  EXPECT_EQ(trim("   "), "");
}

}  // namespace
}  // namespace trainer::tracking
