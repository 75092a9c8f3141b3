// End-to-end: the profile: window's traces when the run stops inside it, is resumed inside it or
// ends before it; the traces' step markers and metadata. The progress bar's throughput and train
// lines; the language models' tokens per second.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "cli_fixture.h"

namespace {

namespace fs = std::filesystem;
using trainer::test_support::Cli;
using trainer::test_support::read_file;

struct Range {
  double begin = 0, end = 0;
};

// The complete events ("ph": "X") named `name` of a Chrome trace, as time ranges.
std::vector<Range> ranges_named(const nlohmann::json& trace, const std::string& name) {
  std::vector<Range> out;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X" || e.value("name", "") != name) continue;
    const double ts = e.at("ts").get<double>();
    out.push_back({ts, ts + e.at("dur").get<double>()});
  }
  return out;
}

// The trace is what torch.profiler's schedule writes for steps `first` to `last`: one
// `ProfilerStep#<step>` range per step, holding that step's forward, backward and optimizer
// ranges; `traceName` its own path; no "ERROR" key in a healthy run.
void expect_steps(const fs::path& path, int first, int last) {
  SCOPED_TRACE(path.string());
  ASSERT_TRUE(fs::exists(path));
  const auto trace = nlohmann::json::parse(read_file(path));
  EXPECT_EQ(trace.value("traceName", ""), path.string());
  EXPECT_FALSE(trace.contains("ERROR")) << trace["ERROR"].dump();
  for (int step = first - 1; step <= last + 1; ++step) {
    const auto steps = ranges_named(trace, "ProfilerStep#" + std::to_string(step));
    EXPECT_EQ(steps.size(), step >= first && step <= last ? 1u : 0u) << "step " << step;
  }
  for (const char* phase : {"trainer::forward", "trainer::backward", "trainer::optimizer"}) {
    const auto phases = ranges_named(trace, phase);
    ASSERT_EQ(phases.size(), static_cast<size_t>(last - first + 1)) << phase;
    for (int i = 0; i < static_cast<int>(phases.size()); ++i) {
      const auto step = ranges_named(trace, "ProfilerStep#" + std::to_string(first + i));
      ASSERT_EQ(step.size(), 1u);
      EXPECT_GE(phases[i].begin, step[0].begin) << phase << " of step " << first + i;
      EXPECT_LE(phases[i].end, step[0].end) << phase << " of step " << first + i;
    }
  }
}

// A run stopped inside the window (train.stop_at_step) writes the steps recorded until then; its
// resume records the rest of the window into a trace of its own, the first one kept.
TEST_F(Cli, ProfileWindowCutByAStopIsWrittenAndItsResumeRecordsTheRest) {
  const auto run_dir = dir_ / "run";
  const std::string args =
      "--config configs/synthetic.yaml --set train.max_steps=8 --set profile.start_step=2 "
      "--set profile.steps=4 --run-dir '" +
      run_dir.string() + "'";
  auto r = run(args + " --set train.stop_at_step=3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("gpuGetDeviceCount"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("gpuGetDeviceCount"), std::string::npos) << r.out;
  expect_steps(run_dir / "profile" / "rank_0.trace.json", 2, 3);

  r = run(args + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_steps(run_dir / "profile" / "rank_0.from_step_4.trace.json", 4, 5);
  expect_steps(run_dir / "profile" / "rank_0.trace.json", 2, 3);  // the first part kept
  EXPECT_NE(read_file(run_dir / "train.log").find("profiled steps 4 to 5"), std::string::npos);
}

// A whole window: steps 2 to 4 marked; a window after the run's last step is warned about, and
// nothing is written.
TEST_F(Cli, ProfileWindowMarksItsStepsAndAWindowAfterTheEndIsWarnedAbout) {
  auto r =
      run("--config configs/synthetic.yaml --set train.max_steps=6 --set profile.start_step=2 "
          "--set profile.steps=3 --run-dir '" +
          (dir_ / "whole").string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_steps(dir_ / "whole" / "profile" / "rank_0.trace.json", 2, 4);

  r =
      run("--config configs/synthetic.yaml --set train.max_steps=3 --set profile.start_step=5 "
          "--run-dir '" +
          (dir_ / "late").string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("profile.start_step 5 is after the run's last step 3"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "late" / "profile"));
}

// The train records of a run's metrics.jsonl.
std::vector<nlohmann::json> train_records(const fs::path& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto record = nlohmann::json::parse(line);
    if (record.value("split", "") == "train") out.push_back(record);
  }
  return out;
}

// run.progress: the bar shows the throughput from the first step, before the first train
// record; the train lines stay on the console above it.
TEST_F(Cli, ProgressBarShowsThroughputBeforeTheFirstRecordAndKeepsTheTrainLines) {
  auto r =
      run("--config configs/synthetic.yaml --set train.max_steps=6 --set run.log_every=3 "
          "--set run.progress=always --run-dir '" +
          (dir_ / "run").string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"( 1/6 loss - ([0-9.]+) samples/s)")))
      << r.err;
  EXPECT_GT(std::stod(m[1].str()), 0.0) << m[0];
  for (const char* line : {"step 3/6 epoch 0 loss ", "step 6/6 epoch 0 loss "}) {
    EXPECT_NE(r.err.find(line), std::string::npos) << line << " not on the console:\n" << r.err;
  }
  // Nothing language-model-like for images.
  for (const auto& record : train_records(dir_ / "run"))
    EXPECT_FALSE(record.contains("tokens_per_sec"));
}

// A language model's train records and lines carry tokens per second: samples per second times
// the sequence length.
TEST_F(Cli, LanguageModelsLogTokensPerSecond) {
  const auto corpus = write("corpus.txt", std::string(4000, 'a') + "the quick brown fox\n");
  const auto run_dir = dir_ / "lm";
  auto r = run("--config configs/gpt_char.yaml --set data.root='" + corpus.string() +
               "' --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 "
               "--set model.block_size=32 --set data.batch_size=8 --set train.max_steps=3 "
               "--set run.log_every=1 --set run.progress=never --run-dir '" +
               run_dir.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto records = train_records(run_dir);
  ASSERT_EQ(records.size(), 3u);
  for (const auto& record : records) {
    ASSERT_TRUE(record.contains("tokens_per_sec")) << record.dump();
    EXPECT_NEAR(record["tokens_per_sec"].get<double>(),
                32.0 * record["samples_per_sec"].get<double>(),
                1e-6 * record["tokens_per_sec"].get<double>())
        << record.dump();
  }
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(step 3/3 .* samples/s [0-9]+ tokens/s)")))
      << r.err;
}

// A language model's train records carry the model FLOPs utilisation: `tflops` is the model FLOPs
// of a sample (forward and backward: 3 x the forward's matrix products, counted here from the
// gpt's shapes as torch.utils.flop_counter counts them) times the samples per second, and `mfu`
// that over the peak the log names. The evaluations show a progress bar of their batches.
TEST_F(Cli, LanguageModelsLogModelFlopsUtilisationAndEvaluationProgress) {
  const auto corpus = write("corpus.txt", std::string(4000, 'a') + "the quick brown fox\n");
  const auto run_dir = dir_ / "lm";
  auto r = run("--config configs/gpt_char.yaml --set data.root='" + corpus.string() +
               "' --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2 "
               "--set model.block_size=32 --set data.batch_size=8 --set train.max_steps=3 "
               "--set run.log_every=1 --set run.eval_every=3 --set data.eval_batch_size=4 "
               "--set run.progress=always --run-dir '" +
               run_dir.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  // Per layer: c_attn 3E, attention's projection E, the MLP 4E and 4E (2 FLOPs a multiply-add),
  // attention's two products 4 T^2 E; then the head over the 256 bytes.
  const double T = 32, E = 32, L = 2, V = 256;
  const double forward =
      L * (2 * T * E * (3 * E + E + 4 * E + 4 * E) + 4 * T * T * E) + 2 * T * E * V;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.err, m,
      std::regex(R"(model FLOPs ([0-9.e+]+) per sample; MFU against ([0-9.e+-]+) TFLOP/s)")))
      << r.err;
  EXPECT_NEAR(std::stod(m[1].str()), 3 * forward, 1e-5 * 3 * forward);
  const double peak = std::stod(m[2].str());
  EXPECT_GT(peak, 0.0);
  const auto records = train_records(run_dir);
  ASSERT_EQ(records.size(), 3u);
  for (const auto& record : records) {
    ASSERT_TRUE(record.contains("mfu")) << record.dump();
    const double tflops = record["tflops"].get<double>();
    EXPECT_NEAR(tflops, 3 * forward * record["samples_per_sec"].get<double>() / 1e12,
                1e-6 * tflops);
    EXPECT_NEAR(record["mfu"].get<double>(), tflops / peak, 1e-5 * tflops / peak);
  }
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(step 3/3 .* tokens/s MFU [0-9.]+%)")))
      << r.err;
  // The validation split's 10% of the bytes, in batches of 4 samples of 33 bytes.
  EXPECT_TRUE(std::regex_search(r.err, m, std::regex(R"(eval \[#+\] ([0-9]+)/([0-9]+) batches)")))
      << r.err;
  EXPECT_EQ(m[1].str(), m[2].str());
  // trainer eval shows it too; images log no MFU.
  r = run("eval --checkpoint '" + run_dir.string() + "' --set run.progress=always");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find(" batches"), std::string::npos) << r.err;
  r =
      run("--config configs/synthetic.yaml --set train.max_steps=2 --set run.log_every=1 "
          "--set run.progress=never --run-dir '" +
          (dir_ / "mlp").string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const auto& record : train_records(dir_ / "mlp")) EXPECT_FALSE(record.contains("mfu"));
}

// MFU's peak is measured once per run: a resume on the same kind of device divides by the peak
// the run's first process measured (each record's tflops / mfu) and says so; a record of another
// device kind is measured again, said in the log, and recorded over.
TEST_F(Cli, AResumedRunsMfuIsAgainstTheRunsPeak) {
  const auto corpus = write("corpus.txt", std::string(4000, 'a') + "the quick brown fox\n");
  const auto run_dir = dir_ / "lm";
  const std::string args =
      "--config configs/gpt_char.yaml --set data.root='" + corpus.string() +
      "' --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 "
      "--set model.block_size=32 --set data.batch_size=4 --set train.max_steps=4 "
      "--set run.log_every=1 --set run.eval_every=0 --set train.eval_at_end=false "
      "--run-dir '" +
      run_dir.string() + "'";
  auto r = run(args + " --set train.stop_at_step=2");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto record_path = run_dir / "peak_tflops.json";
  const auto first = nlohmann::json::parse(read_file(record_path));
  r = run(args + " --set train.stop_at_step=3 --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("measured at its start"), std::string::npos) << r.err;
  // A record of another kind of device: measured again, and said.
  auto other = first;
  other["device"] = "cpu: another CPU, 1 threads";
  std::ofstream(record_path) << other.dump();
  r = run(args + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("re-measured: the run's peak"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("was measured on cpu: another CPU"), std::string::npos) << r.err;
  EXPECT_EQ(nlohmann::json::parse(read_file(record_path))["device"], first["device"]);
  const auto records = train_records(run_dir);
  ASSERT_EQ(records.size(), 4u);
  std::vector<double> peaks;
  for (const auto& record : records) {
    peaks.push_back(record["tflops"].get<double>() / record["mfu"].get<double>());
    EXPECT_NEAR(record.value("peak_tflops", 0.0), peaks.back(), 1e-9 * peaks.back());
  }
  EXPECT_NEAR(peaks[0], first["tflops"].get<double>(), 1e-9 * peaks[0]);
  EXPECT_NEAR(peaks[1], peaks[0], 1e-9 * peaks[0]);
  EXPECT_NEAR(peaks[2], peaks[0], 1e-9 * peaks[0]);  // the resumed process's
}

// LoRA's model FLOPs count what its step computes: the frozen base's products forward and their
// input gradients (none before the first adapted layer: the embeddings and the first norm are
// frozen), the adapters' products forward, input and weight gradients. Counted here by hand from
// the gpt's shapes (2 FLOPs a multiply-add).
TEST_F(Cli, LoraModelFlopsLeaveOutTheFrozenWeightsGradients) {
  const auto corpus = write("corpus.txt", std::string(4000, 'a') + "the quick brown fox\n");
  auto r = run("--config configs/gpt_char.yaml --set data.root='" + corpus.string() +
               "' --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2 "
               "--set model.block_size=32 --set data.batch_size=8 --set train.max_steps=1 "
               "--set model.lora.rank=4 --set run.progress=never --run-dir '" +
               (dir_ / "lora").string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_NE(r.err.find("2 layers adapted (c_attn), rank 4"), std::string::npos) << r.err;
  const double T = 32, E = 32, V = 256, R = 4;
  const double c_attn = 2 * T * E * 3 * E, proj = 2 * T * E * E, mlp = 2 * 2 * T * E * 4 * E;
  const double attention = 4 * T * T * E, head = 2 * T * E * V;
  const double a = 2 * T * E * R, b = 2 * T * R * 3 * E;  // the adapters' products
  const double layer = c_attn + a + b + attention + proj + mlp;
  const double forward = 2 * layer + head;
  // Backward: the first layer's c_attn input needs no gradient; attention twice its forward.
  const double first = a + 2 * b + 2 * attention + proj + mlp;
  const double second = c_attn + 2 * a + 2 * b + 2 * attention + proj + mlp;
  const double expected = forward + first + second + head;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"(model FLOPs ([0-9.e+]+) per sample)")))
      << r.err;
  EXPECT_NEAR(std::stod(m[1].str()), expected, 1e-5 * expected);
  EXPECT_LT(expected, 3 * forward);
}

// A slow run, its stderr not a terminal: its first step is logged at once (with run.log_every
// later), the rates with three significant digits, the samples data.drop_last leaves out said,
// and after a resume, the steps of the run and of this process told apart.
TEST_F(Cli, ASlowRunLogsItsFirstStepItsRatesAndWhatAResumeTrained) {
  const auto run_dir = dir_ / "slow";
  // 21 samples in batches of 2: 10 batches an epoch, 21 % 2 = 1 sample left out.
  const std::string args =
      "--config configs/synthetic.yaml --set data.batch_size=2 --set data.train_samples=21 "
      "--set data.throttle_ms=300 --set train.max_steps=4 --set run.log_every=4 "
      "--set run.eval_every=0 --set train.eval_at_end=false --set run.progress=auto "
      "--run-dir '" +
      run_dir.string() + "'";
  auto r = run(args + " --set train.stop_at_step=2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("step 1/4 epoch 0: first step in "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("data.drop_last: each epoch leaves out 1 of the 21 training samples"),
            std::string::npos)
      << r.err;
  r = run(args + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("step 3/4 epoch 0: first step in "), std::string::npos) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.err, m, std::regex(R"(step 4/4 epoch 0 loss \S+ lr \S+ ([0-9.]+) samples/s)")))
      << r.err;
  const auto records = train_records(run_dir);
  ASSERT_FALSE(records.empty());
  const double sps = records.back()["samples_per_sec"].get<double>();
  ASSERT_LT(sps, 100.0);  // batches of 2 samples, each 300 ms late: a rate shown with decimals
  EXPECT_NEAR(std::stod(m[1].str()), sps, 0.01 * sps) << m[0];
  EXPECT_NE(m[1].str().find('.'), std::string::npos) << m[0];
  ASSERT_TRUE(std::regex_search(r.err, m,
                                std::regex(R"(done: 4 steps \(2 in this process, ([0-9.]+) s\))")))
      << r.err;
  EXPECT_GT(std::stod(m[1].str()), 0.0);
}

}  // namespace
