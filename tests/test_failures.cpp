// Faults a run must survive without mixing, losing or crashing: run dirs used twice, locks,
// corrupt or unreadable checkpoints and manifests, files changing under a run, signals at awkward
// moments, file-size limits, bad values. Each test runs the trainer binary as real processes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_fixture.h"
#include "util/fileio.h"

namespace {

namespace fs = std::filesystem;
using trainer::test_support::Cli;
using trainer::test_support::read_file;
using trainer::test_support::step_file;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The small MLP on synthetic data (16 steps per epoch at batch 32), no progress bar.
std::string quick(const fs::path& run_dir) {
  return "--config configs/synthetic.yaml --set run.progress=never --run-dir '" + run_dir.string() +
         "'";
}

// A run long enough to be interrupted: about 50 ms steps, one line per step.
std::string slow(const fs::path& run_dir) {
  return quick(run_dir) +
         " --set model.hidden=[1024,1024] --set data.shape=[1,32,32] "
         "--set data.train_samples=4096 --set data.batch_size=256 --set data.workers=1 "
         "--set run.log_every=1 --set optim.lr=0.01 --set data.num_classes=10";
}

// Shell: wait until `file` has at least `n` lines containing "train".
std::string until_train_lines(const fs::path& file, int n) {
  return "until [ \"$(cat '" + file.string() + "' 2>/dev/null | grep -c train)\" -ge " +
         std::to_string(n) + " ]; do sleep 0.02; done\n";
}

// The checkpoint files of a run dir and the files its manifest lists.
std::pair<std::set<std::string>, std::set<std::string>> files_and_listed(const fs::path& run_dir) {
  std::set<std::string> files, listed;
  if (!fs::exists(run_dir / "checkpoints" / "manifest.json")) return {files, listed};
  for (const auto& e : fs::directory_iterator(run_dir / "checkpoints")) {
    const auto name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0) files.insert(name);  // temporaries too: step_*.tmp.<pid>
  }
  const auto manifest = nlohmann::json::parse(read_file(run_dir / "checkpoints" / "manifest.json"));
  for (const auto& c : manifest["checkpoints"]) listed.insert(c["file"].get<std::string>());
  return {files, listed};
}

// A fresh run never mixes with the run already in its dir: refused, naming the choices, with
// nothing written; run.overwrite moves the earlier run aside whole, and a later --resume auto
// continues the new run.
TEST_F(Cli, AFreshRunIntoAUsedRunDirIsRefusedOrMovesTheOldOneAside) {
  const auto b = dir_ / "b";
  ASSERT_EQ(run(quick(b) + " --set train.max_steps=20 --set run.checkpoint_every=5").code, 0);
  const std::string metrics = read_file(b / "metrics.jsonl"), config = read_file(b / "config.yaml");
  const std::string again =
      quick(b) + " --set train.max_steps=12 --set run.checkpoint_every=4 --set seed=5";
  auto r = run(again);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(
      has(r.err, "run.dir: " + b.string() + " holds another run (checkpoints up to step 20"))
      << r.err;
  EXPECT_TRUE(has(r.err, "--resume auto") && has(r.err, "run.overwrite: true")) << r.err;
  EXPECT_EQ(read_file(b / "metrics.jsonl"), metrics);
  EXPECT_EQ(read_file(b / "config.yaml"), config);

  r = run(again + " --set run.overwrite=true");
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<fs::path> aside;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (has(e.path().filename().string(), "b.replaced-")) aside.push_back(e.path());
  }
  ASSERT_EQ(aside.size(), 1u) << r.err;
  EXPECT_EQ(read_file(aside[0] / "metrics.jsonl"), metrics);
  EXPECT_TRUE(fs::exists(aside[0] / "checkpoints" / step_file(20)));
  EXPECT_FALSE(fs::exists(b / "checkpoints" / step_file(20)));
  EXPECT_EQ(Cli::metrics(b, "train").front()["step"], 4);

  r = run(again + " --set train.max_steps=16 --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "resumed from " + (b / "checkpoints" / step_file(12)).string())) << r.err;
}

// Two trainers on one run dir: the second is refused naming the first (pid and host); the first's
// metrics stay whole lines.
TEST_F(Cli, ASecondTrainerOnALockedRunDirIsRefused) {
  const auto b = dir_ / "b";
  auto r = sh("\"$TRAINER\" " + slow(b) + " --set train.max_steps=100000 & pid=$!\n" +
              until_train_lines(b / "metrics.jsonl", 2) + "echo \"pid=$pid\"\n\"$TRAINER\" " +
              slow(b) + " --resume auto > /dev/null 2> '" + (dir_ / "second.txt").string() +
              "'; echo \"second=$?\"\nkill -TERM $pid; wait $pid; echo \"first=$?\"");
  const std::string second = read_file(dir_ / "second.txt");
  const auto pid = r.out.substr(r.out.find("pid=") + 4, r.out.find('\n') - r.out.find("pid=") - 4);
  EXPECT_TRUE(has(r.out, "second=1")) << r.out << second;
  EXPECT_TRUE(has(second, b.string() + " is in use by another trainer (pid " + pid + " on "))
      << second;
  EXPECT_TRUE(has(r.out, "first=0")) << r.out << r.err;
  for (const auto& line : Cli::metrics(b, "train")) EXPECT_TRUE(line.contains("loss"));
}

// A token file that shrinks under a running job: one line naming it, exit 1, the steps trained so
// far saved.
TEST_F(Cli, ATokenFileThatShrinksEndsTheRunNamingIt) {
  const auto corpus = dir_ / "corpus.txt";
  {
    std::ofstream out(corpus);
    std::mt19937 gen(7);
    for (int i = 0; i < 400000; ++i) out << static_cast<char>('a' + gen() % 26);
  }
  const auto b = dir_ / "b";
  auto r = sh("\"$TRAINER\" --config configs/gpt_char.yaml --set data.root='" + corpus.string() +
              "' --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 "
              "--set model.block_size=32 --set data.batch_size=8 --set run.log_every=1 "
              "--set run.progress=never --set sched.warmup_steps=0 --run-dir '" +
              b.string() + "' & pid=$!\n" + until_train_lines(b / "metrics.jsonl", 3) +
              "truncate -s 100 '" + corpus.string() + "'\nwait $pid; echo \"exit=$?\"");
  EXPECT_TRUE(has(r.out, "exit=1")) << r.out << r.err;
  EXPECT_TRUE(has(r.err, corpus.string() + ": changed size during training")) << r.err;
  const int64_t last = Cli::metrics(b, "train").back()["step"].get<int64_t>();
  EXPECT_TRUE(fs::exists(b / "checkpoints" / step_file(last))) << r.err;
}

// A resume refused for its config writes nothing: config.yaml, metrics.jsonl and train.log stay.
TEST_F(Cli, AResumeRefusedForItsConfigWritesNothing) {
  const auto b = dir_ / "b";
  ASSERT_EQ(run(quick(b) + " --set train.stop_at_step=3").code, 0);
  const std::string config = read_file(b / "config.yaml"), log = read_file(b / "train.log"),
                    metrics = read_file(b / "metrics.jsonl");
  auto r = run(quick(b) + " --resume auto --set model.hidden=[128]");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(read_file(b / "config.yaml"), config);
  EXPECT_EQ(read_file(b / "train.log"), log);
  EXPECT_EQ(read_file(b / "metrics.jsonl"), metrics);
  // A stop step before the step resumed from is an error too, not ignored.
  r = run(quick(b) + " --resume auto --set train.stop_at_step=2");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "train.stop_at_step: is 2 but the run resumes after step 3")) << r.err;
}

// When no checkpoint verifies, --resume auto fails naming them instead of starting over.
TEST_F(Cli, EveryCheckpointCorruptStopsTheResume) {
  const auto b = dir_ / "b";
  ASSERT_EQ(run(quick(b) + " --set run.checkpoint_every=4 --set train.stop_at_step=12").code, 0);
  for (int step : {4, 8, 12}) {
    const auto path = b / "checkpoints" / step_file(step);
    fs::resize_file(path, fs::file_size(path) / 2);
  }
  auto r = run(quick(b) + " --resume auto");
  EXPECT_EQ(r.code, 1) << r.err;
  for (int step : {4, 8, 12}) EXPECT_TRUE(has(r.err, step_file(step))) << r.err;
  EXPECT_FALSE(has(r.err, "starting from step 0")) << r.err;
}

// Each damaged checkpoint file, and a manifest that cannot be read, is reported once: not again
// in the error that lists them, nor at every save (each lists the folder anew) of a run that
// starts over because no file beside a missing manifest is usable.
TEST_F(Cli, EachDamagedCheckpointIsReportedOnce) {
  const auto count = [](const std::string& text, const std::string& part) {
    int n = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
  };
  const auto b = dir_ / "b";
  ASSERT_EQ(run(quick(b) + " --set run.checkpoint_every=4 --set train.stop_at_step=12").code, 0);
  for (int step : {4, 8, 12}) {
    const auto path = b / "checkpoints" / step_file(step);
    fs::resize_file(path, fs::file_size(path) / 2);
  }
  auto r = run(quick(b) + " --resume auto");  // listed, and none verifies: exit 1
  EXPECT_EQ(r.code, 1) << r.err;
  for (int step : {4, 8, 12}) EXPECT_EQ(count(r.err, step_file(step)), 1) << r.err;
  // No manifest: the damaged files are left as they are and the run starts over, saving at steps
  // 16 and 32.
  fs::remove(b / "checkpoints" / "manifest.json");
  r = run(quick(b) + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "starting from step 0")) << r.err;
  EXPECT_EQ(count(r.err, "checkpoint " + (b / "checkpoints" / step_file(32)).string()), 1) << r.err;
  for (int step : {4, 8, 12}) {
    EXPECT_EQ(count(r.err, step_file(step) + ": not a valid safetensors file"), 1) << r.err;
  }
  // A manifest that cannot be read: the resume, its repair and the saves after it say so once.
  const auto c = dir_ / "c";
  ASSERT_EQ(run(quick(c) + " --set run.checkpoint_every=4 --set train.stop_at_step=12").code, 0);
  std::ofstream(c / "checkpoints" / "manifest.json") << "{\"checkpoints\": [{\"file\": ";
  r = run(quick(c) + " --resume auto --set train.max_steps=16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count(r.err, "unreadable manifest"), 1) << r.err;
}

// A manifest that cannot be read: --resume auto takes the checkpoint files themselves.
TEST_F(Cli, AnUnreadableManifestStillResumes) {
  const auto b = dir_ / "b";
  ASSERT_EQ(run(quick(b) + " --set run.checkpoint_every=4 --set train.stop_at_step=12").code, 0);
  std::ofstream(b / "checkpoints" / "manifest.json") << "{\"checkpoints\": [{\"file\": ";
  auto r = run(quick(b) + " --resume auto --set train.max_steps=16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "resumed from " + (b / "checkpoints" / step_file(12)).string())) << r.err;
  const auto [files, listed] = files_and_listed(b);
  EXPECT_EQ(files, listed);
  EXPECT_EQ(files.size(), 3u);
}

// Steps whose loss is inf/NaN: every train line has its loss (NaN, as Python's json writes it),
// the checkpoint's non-finite metrics do not break the manifest, and --resume auto finds it.
TEST_F(Cli, NonFiniteLossesAreWrittenAndResumable) {
  const auto b = dir_ / "b";
  const std::string diverging = quick(b) +
                                " --set optim.lr=1e30 --set run.log_every=1 --set run.eval_every=1 "
                                "--set train.max_bad_steps=3";
  auto r = run(diverging);
  EXPECT_EQ(r.code, 1) << r.err;
  const std::string lines = read_file(b / "metrics.jsonl");
  EXPECT_TRUE(has(lines, "\"loss\":NaN")) << lines;
  std::istringstream in(lines);
  for (std::string line; std::getline(in, line);) EXPECT_TRUE(has(line, "\"loss\":")) << line;
  const auto manifest = nlohmann::json::parse(read_file(b / "checkpoints" / "manifest.json"));
  EXPECT_FALSE(manifest["checkpoints"].empty());
  r = run(diverging + " --resume auto");
  EXPECT_TRUE(has(r.err, "resumed from")) << r.err;
  EXPECT_FALSE(has(r.err, "unreadable manifest")) << r.err;
}

// A save past `ulimit -f`: the save-failure message (no earlier checkpoint claimed), exit 1, no
// temporary file left; run.continue_on_save_error trains on.
TEST_F(Cli, ASaveBeyondTheFileSizeLimitFailsWithAMessage) {
  const auto b = dir_ / "b";
  const std::string big = quick(b) + " --set model.hidden=[512,512]";
  auto r = sh("ulimit -f 256\n\"$TRAINER\" " + big + "; echo \"exit=$?\"");
  EXPECT_TRUE(has(r.out, "exit=1")) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "checkpoint at step 16 not saved")) << r.err;
  EXPECT_TRUE(has(r.err, "File too large")) << r.err;
  EXPECT_TRUE(has(r.err, "no earlier checkpoint of this run exists")) << r.err;
  EXPECT_TRUE(has(r.err, "run.continue_on_save_error")) << r.err;
  for (const auto& e : fs::directory_iterator(b / "checkpoints")) {
    EXPECT_FALSE(has(e.path().filename().string(), ".tmp")) << e.path();
  }
  r = sh("ulimit -f 256\n\"$TRAINER\" " + big +
         " --set run.overwrite=true --set run.continue_on_save_error=true; echo \"exit=$?\"");
  EXPECT_TRUE(has(r.out, "exit=0")) << r.out << r.err;
  EXPECT_EQ(Cli::metrics(b, "train").back()["step"], 32);
}

// A run dir where checkpoints cannot go is found before training, not at the first save.
TEST_F(Cli, ACheckpointsPathThatIsAFileIsFoundAtStart) {
  const auto b = dir_ / "b";
  fs::create_directories(b);
  std::ofstream(b / "checkpoints") << "a file where the checkpoint folder goes";
  auto r = run(quick(b));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, (b / "checkpoints").string() + " is not a directory")) << r.err;
  EXPECT_FALSE(fs::exists(b / "metrics.jsonl"));
}

// Two SIGINTs a millisecond apart: the second ends the process at once, wherever it lands. The
// manifest never names a missing file; a checkpoint left outside it is whole, and the next run
// adopts it and prunes as usual (temporary files too).
TEST_F(Cli, TwoQuickSigintsLeaveNoCheckpointOutsideTheManifest) {
  const auto b = dir_ / "b";
  const std::string every_step = " --set run.checkpoint_every=1 --set run.keep_last=2";
  for (int round = 0; round < 3; ++round) {
    auto r = sh("\"$TRAINER\" " + slow(b) + every_step +
                " --set train.max_steps=100000 --resume auto & pid=$!\n" +
                until_train_lines(b / "metrics.jsonl", 2 * (round + 1)) +
                "kill -INT $pid; sleep 0.001; kill -INT $pid; wait $pid; echo \"exit=$?\"");
    EXPECT_TRUE(has(r.out, "exit=0") || has(r.out, "exit=130")) << r.out << r.err;
    const auto [files, listed] = files_and_listed(b);
    for (const auto& f : listed) EXPECT_TRUE(files.count(f)) << f << " listed but missing";
  }
  auto r = run(slow(b) + every_step + " --resume auto --set train.max_steps=20");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "trying the previous checkpoint")) << r.err;
  const auto [files, listed] = files_and_listed(b);
  EXPECT_EQ(files, listed);
  EXPECT_EQ(listed, (std::set<std::string>{step_file(19), step_file(20)}));
}

// SIGTERM while the trainer is still starting (here: reading its config from a pipe) stops it
// after one step with a checkpoint, as during training.
TEST_F(Cli, SigtermDuringStartUpStopsAfterAStep) {
  const auto b = dir_ / "b", fifo = dir_ / "config.yaml";
  auto r = sh("mkfifo '" + fifo.string() + "'\n\"$TRAINER\" --config '" + fifo.string() +
              "' --run-dir '" + b.string() +
              "' --set run.progress=never & pid=$!\n"
              "exec 3>'" +
              fifo.string() +
              "'\n"  // returns once the trainer has opened its config
              "kill -TERM $pid\ncat configs/synthetic.yaml >&3\nexec 3>&-\n"
              "wait $pid; echo \"exit=$?\"");
  EXPECT_TRUE(has(r.out, "exit=0")) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "stopping after step 1 (signal)")) << r.err;
  EXPECT_TRUE(fs::exists(b / "checkpoints" / step_file(1))) << r.err;
}

// Values the config checks must catch: an infinite learning rate, a sample shape too large to
// allocate.
TEST_F(Cli, InfiniteAndHugeValuesAreConfigErrors) {
  auto r = run(quick(dir_ / "b") + " --set optim.lr=.inf --dry-run");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "optim.lr: must be a finite number, got .inf")) << r.err;
  r = run(quick(dir_ / "b") + " --set data.shape=[100000,100000,100000] --dry-run");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "data.shape: a sample of this shape holds more than 2^28 values"))
      << r.err;
}

// A rank other than 0 that cannot reach the rendezvous: one line naming it and the key, no C++
// stack frames, ended by dist.init_timeout_s (plus the process's start-up), not by c10d's retries.
TEST_F(Cli, AnUnreachableMasterIsOneLineWithinTheTimeout) {
  auto r =
      sh("start=$(date +%s%N)\nRANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 "
         "MASTER_ADDR=127.0.0.1 MASTER_PORT=9 \"$TRAINER\" " +
         quick(dir_ / "b") +
         " --set dist.init_timeout_s=6; echo \"exit=$?\"\n"
         "echo \"ms=$(( ($(date +%s%N) - start) / 1000000 ))\"");
  EXPECT_TRUE(has(r.out, "exit=1")) << r.out << r.err;
  EXPECT_EQ(r.err,
            "trainer: rank 1 could not reach the rendezvous at 127.0.0.1:9 within 6 s "
            "(dist.init_timeout_s); check that rank 0 is running and "
            "MASTER_ADDR/MASTER_PORT point at it\n");
  const int ms = std::stoi(r.out.substr(r.out.find("ms=") + 3));
  EXPECT_GE(ms, 6000);
  EXPECT_LT(ms, 6600 + 2000) << "6 s plus 10%, and up to 2 s to start the process";
  EXPECT_FALSE(fs::exists(dir_ / "b"));
}

// A YAML alias bomb (12 levels of 9 aliases each: 9^12 nodes from 600 bytes) is refused as soon
// as its expansion passes a million nodes, instead of taking hours.
TEST_F(Cli, AYamlAliasBombIsAConfigError) {
  std::string yaml = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 12; ++i) {
    const std::string prev = "*a" + std::to_string(i - 1);
    yaml += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 9; ++k) yaml += (k ? ", " : "") + prev;
    yaml += "]\n";
  }
  const auto path = write("bomb.yaml", yaml);
  auto r = run("--config '" + path.string() + "' --dry-run");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, path.string() + ": expands to more than 1,000,000 YAML nodes")) << r.err;
}

// A crafted weights file given as model.pretrained: a config error naming the file and the
// field, exit 2.
TEST_F(Cli, ACraftedPretrainedFileIsAConfigErrorNamingIt) {
  const std::string header = R"({"fc1.weight":{"dtype":"F32","shape":"64","data_offsets":[0,4]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(header.size() >> (8 * i));
  const auto path = write("w.safetensors", bytes + header + std::string(4, '\0'));
  auto r = run(quick(dir_ / "b") + " --set model.pretrained='" + path.string() + "' --dry-run");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "model.pretrained: " + path.string() +
                             ": not a valid safetensors file: tensor 'fc1.weight' has shape"))
      << r.err;
}

// trainer export onto its own checkpoint, or from crafted metadata, fails naming the file.
TEST_F(Cli, ExportRefusesToReplaceItsCheckpointAndNamesBadFiles) {
  const auto b = dir_ / "b";
  ASSERT_EQ(run(quick(b) + " --set train.stop_at_step=2").code, 0);
  const auto ckpt = b / "checkpoints" / step_file(2);
  const auto size = fs::file_size(ckpt);
  auto r = run("export --checkpoint '" + ckpt.string() + "' --out '" + ckpt.string() + "'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "is the checkpoint itself")) << r.err;
  EXPECT_EQ(fs::file_size(ckpt), size);
  // Weights exported from it are not a checkpoint: exporting them again names the file.
  const auto weights = dir_ / "w.safetensors";
  ASSERT_EQ(
      run("export --checkpoint '" + ckpt.string() + "' --out '" + weights.string() + "'").code, 0);
  r = run("export --checkpoint '" + weights.string() + "' --out '" +
          (dir_ / "w2.safetensors").string() + "'");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, weights.string())) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "w2.safetensors"));
}

// A GPT-2 tokenizer folder `dir` small enough to write: a token for each byte (GPT-2's
// byte-to-character map), "ab", <|endoftext|>, and the one merge "a b".
void write_tiny_tokenizer(const fs::path& dir) {
  fs::create_directories(dir);
  nlohmann::json encoder = nlohmann::json::object();
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool same = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int code = same ? b : 256 + extra++;
    std::string utf8;  // code < 0x800: one or two UTF-8 bytes
    if (code < 0x80) {
      utf8 = std::string(1, static_cast<char>(code));
    } else {
      utf8 = {static_cast<char>(0xC0 | (code >> 6)), static_cast<char>(0x80 | (code & 0x3F))};
    }
    encoder[utf8] = b;
  }
  encoder["ab"] = 256;
  encoder["<|endoftext|>"] = 257;
  std::ofstream(dir / "encoder.json") << encoder.dump();
  std::ofstream(dir / "vocab.bpe") << "#version: 0.2\na b\n";
}

struct stat stat_of(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st;
}

// tokenize --out never replaces a FIFO, a character device (through a symlink: /dev/null is
// never named) or a folder, nor one of its inputs under any name (another path, a hard link) or
// the tokenizer's files: exit 2, one line, nothing changed. A regular file is replaced.
TEST_F(Cli, TokenizeOutNeverReplacesADeviceAFifoOrItsInput) {
  write_tiny_tokenizer(dir_ / "tok");
  const auto text = write("a.txt", "ab ab ba\n");
  const std::string tokenize = "tokenize --tokenizer '" + (dir_ / "tok").string() + "' ";
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  fs::create_symlink("/dev/null", dir_ / "null");
  fs::create_directories(dir_ / "folder");
  fs::create_directories(dir_ / "sub");
  fs::create_hard_link(text, dir_ / "link.txt");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"fifo", "is a FIFO, not a regular file"},
      {"null", "is a character device, not a regular file"},
      {"folder", "is a folder, not a regular file"},
      {"a.txt", "is the input " + text.string() + ": writing the output there would destroy"},
      {"sub/../a.txt", "is the input " + text.string() + " (the same file under another name)"},
      {"link.txt", "is the input " + text.string() + " (the same file under another name)"},
      {"tok/vocab.bpe", "is the input " + (dir_ / "tok" / "vocab.bpe").string()},
  };
  for (const auto& [out, needle] : cases) {
    const auto r = run(tokenize + "--out '" + (dir_ / out).string() + "' '" + text.string() + "'");
    EXPECT_EQ(r.code, 2) << out << ": " << r.err;
    EXPECT_TRUE(has(r.err, "--out " + (dir_ / out).string() + " " + needle))
        << out << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_TRUE(S_ISFIFO(stat_of(dir_ / "fifo").st_mode));
  EXPECT_TRUE(fs::is_symlink(dir_ / "null"));
  EXPECT_TRUE(S_ISCHR(stat_of("/dev/null").st_mode));
  EXPECT_EQ(read_file(text), "ab ab ba\n");
  EXPECT_EQ(read_file(dir_ / "tok" / "vocab.bpe"), "#version: 0.2\na b\n");
  // A regular file is replaced: "ab", " ", "ab", " ", "b", "a", "\n" as uint16 ids.
  const auto old = write("old.bin", "previous contents");
  const auto r = run(tokenize + "--out '" + old.string() + "' '" + text.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(fs::file_size(old), 14u);
  EXPECT_TRUE(has(r.out, " of 1 document, ")) << r.out;  // singular for one
}

// export --out and bench --json check their outputs the same way: a FIFO, a character device,
// a folder where a file goes (a file where a folder goes), the checkpoint under another name, the
// config: exit 2 before anything is written.
TEST_F(Cli, ExportAndBenchOutputsNeverReplaceADeviceAFifoOrAnInput) {
  const auto b = dir_ / "b";
  ASSERT_EQ(run(quick(b) + " --set train.stop_at_step=2").code, 0);
  const auto ckpt = b / "checkpoints" / step_file(2);
  const auto size = fs::file_size(ckpt);
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  fs::create_symlink("/dev/null", dir_ / "null");
  fs::create_hard_link(ckpt, dir_ / "hard.safetensors");
  fs::create_directories(dir_ / "hf");
  ASSERT_EQ(::mkfifo((dir_ / "hf" / "config.json").c_str(), 0600), 0);
  const auto plain = write("plain.txt", "x");
  const std::string export_ = "export --checkpoint '" + ckpt.string() + "' --out '";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"fifo'", "fifo is a FIFO, not a regular file"},
      {"null'", "null is a character device, not a regular file"},
      {"b'", "b is a folder, not a regular file"},
      {"hard.safetensors'", "hard.safetensors is the checkpoint itself"},
      {"plain.txt' --format hf", "plain.txt is a regular file, not a folder"},
      {"hf' --format hf", "hf/config.json is a FIFO, not a regular file"},
  };
  for (const auto& [out, needle] : cases) {
    const auto r = run(export_ + (dir_ / out).string());
    EXPECT_EQ(r.code, 2) << out << ": " << r.err;
    EXPECT_TRUE(has(r.err, "--out " + dir_.string() + "/" + needle)) << out << ": " << r.err;
  }
  EXPECT_TRUE(S_ISFIFO(stat_of(dir_ / "fifo").st_mode));
  EXPECT_TRUE(S_ISFIFO(stat_of(dir_ / "hf" / "config.json").st_mode));
  EXPECT_FALSE(fs::exists(dir_ / "hf" / "model.safetensors"));
  EXPECT_TRUE(S_ISCHR(stat_of("/dev/null").st_mode));
  EXPECT_EQ(fs::file_size(ckpt), size);
  for (const auto& [json, needle] : std::vector<std::pair<fs::path, std::string>>{
           {dir_ / "fifo", "is a FIFO"}, {dir_ / "null", "is a character device"}}) {
    const auto r = run("bench --config configs/synthetic.yaml --steps 2 --warmup 1 --json '" +
                       json.string() + "'");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(has(r.err, "--json " + json.string() + " " + needle)) << r.err;
  }
  const auto config = write("bench.yaml", read_file("configs/synthetic.yaml"));
  const auto r = run("bench --config '" + config.string() + "' --json '" + config.string() + "'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "is the input " + config.string())) << r.err;
  EXPECT_TRUE(S_ISCHR(stat_of("/dev/null").st_mode));
}

// write_atomically itself never renames over what is not a regular file: the FIFO stays, the
// temporary file is removed, IoError names the path.
TEST(FileIo, WriteAtomicallyNeverReplacesADeviceOrAFifo) {
  trainer::test_support::TempDir tmp("fileio");
  const auto fifo = tmp / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink("/dev/null", tmp / "null");
  for (const auto& path : {fifo, tmp / "null", tmp.path()}) {
    try {
      trainer::write_text_atomically(path.string(), "text");
      ADD_FAILURE() << path << ": written";
    } catch (const trainer::IoError& e) {
      EXPECT_TRUE(has(e.what(), path.string() + ": is a")) << e.what();
    }
  }
  EXPECT_TRUE(S_ISFIFO(stat_of(fifo).st_mode));
  EXPECT_TRUE(fs::is_symlink(tmp / "null"));
  EXPECT_TRUE(S_ISCHR(stat_of("/dev/null").st_mode));
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path())) ++entries;
  EXPECT_EQ(entries, 2u);  // no temporary file left
  EXPECT_EQ(trainer::output_problem((tmp / "new").string(), trainer::OutputKind::file), "");
}

// Every train record of metrics.jsonl without its timing field, one string per line.
std::vector<std::string> records(const fs::path& run_dir) {
  std::vector<std::string> out;
  std::istringstream in(read_file(run_dir / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["split"] != "train") continue;
    j.erase("samples_per_sec");
    out.push_back(j.dump());
  }
  return out;
}

// kill -9 fifteen times at random moments of a run that checkpoints every step (while training,
// evaluating or writing a checkpoint): every resume loads, and the end equals an uninterrupted run.
class KillNine : public Cli {
 protected:
  void rounds(const std::string& flags);
};

void KillNine::rounds(const std::string& flags) {
  const auto a = dir_ / "a", b = dir_ / "b";
  const std::string every_step =
      " --set run.checkpoint_every=1 --set run.keep_last=2 --set train.max_steps=30" + flags;
  ASSERT_EQ(run(slow(a) + every_step).code, 0);
  std::mt19937 gen(12345);
  int killed_rounds = 0;
  const std::string train_lines =
      "$(cat '" + (b / "metrics.jsonl").string() + "' 2>/dev/null | grep -c train)";
  for (int round = 0; round < 15; ++round) {
    // Killed once the run has logged 1 to 3 steps beyond what the file held before, after a
    // random delay of up to 150 ms.
    const int steps = 1 + static_cast<int>(gen() % 3);
    const double delay = 0.15 * std::uniform_real_distribution<double>(0, 1)(gen);
    auto r = sh("target=$((" + train_lines + " + " + std::to_string(steps) + "))\n\"$TRAINER\" " +
                slow(b) + every_step + " --resume auto 2>>'" + (dir_ / "rounds.log").string() +
                "' & pid=$!\nuntil [ \"" + train_lines +
                "\" -ge \"$target\" ] || ! kill -0 $pid 2>/dev/null; do sleep 0.01; done\nsleep " +
                std::to_string(delay) + "; kill -9 $pid 2>/dev/null; wait $pid; echo \"exit=$?\"");
    const bool killed = has(r.out, "exit=137");
    killed_rounds += killed;
    EXPECT_TRUE(killed || has(r.out, "exit=0")) << r.out;
  }
  EXPECT_GE(killed_rounds, 8);
  const std::string rounds = read_file(dir_ / "rounds.log");
  EXPECT_TRUE(has(rounds, "resumed from")) << rounds;
  EXPECT_FALSE(has(rounds, "trying the previous checkpoint")) << rounds;
  EXPECT_FALSE(has(rounds, "error")) << rounds;
  auto r = run(slow(b) + every_step + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(records(a), records(b));
  const auto [files, listed] = files_and_listed(b);
  EXPECT_EQ(files, listed);
}

TEST_F(KillNine, DuringSavesNeverLeavesAnUnloadableCheckpoint) {
  rounds("");
}

// The same with run.checkpoint_async: most kills land while a background write is in flight.
TEST_F(KillNine, DuringAsynchronousSavesNeverLeavesAnUnloadableCheckpoint) {
  rounds(" --set run.checkpoint_async=true");
}

}  // namespace
