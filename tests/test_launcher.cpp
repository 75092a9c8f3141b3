// trainer launch: its command line, and run() supervising real worker processes (/bin/sh scripts).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launch/launcher.h"
#include "temp_dir.h"
#include "util/net/net.h"

namespace trainer::launch {
namespace {

using test_support::TempDir;

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << part << "' is not in:\n" << text;
}

testing::AssertionResult Lacks(const std::string& text, const std::string& part) {
  if (text.find(part) == std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << part << "' is in:\n" << text;
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// The lines of text that start with prefix, without it.
std::vector<std::string> lines_with_prefix(const std::string& text, const std::string& prefix) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) lines.push_back(line.substr(prefix.size()));
  }
  return lines;
}

// Waits up to 10 s for a file to appear.
bool wait_for_file(const std::filesystem::path& path) {
  for (int i = 0; i < 1000; ++i) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The pid a worker wrote with write_pid or publish (below).
pid_t read_pid(const std::filesystem::path& path) {
  return static_cast<pid_t>(std::stol(read_text(path)));
}

// No such process, not even a zombie: the launcher has reaped what its workers started.
bool process_gone(pid_t pid) {
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

// Shell lines that write value (shell syntax) to <dir>/<name>, atomically.
std::string publish(const std::string& name, const std::string& value) {
  return "echo " + value + " > \"$dir/" + name + ".tmp\" && mv \"$dir/" + name + ".tmp\" \"$dir/" +
         name + "\"\n";
}

// Shell lines that write the shell's pid to <dir>/<name>.
std::string write_pid(const std::string& name) {
  return publish(name, "$$");
}

// A launch of `/bin/sh <dir>/worker.sh <dir>` with the launcher's streams captured.
class Launch {
 public:
  explicit Launch(const std::string& script) : dir_("launcher") {
    std::ofstream(dir_ / "worker.sh") << "dir=$1\n" << script;
    options.program = "/bin/sh";
    options.args = {(dir_ / "worker.sh").string(), dir_.path().string()};
    options.nproc_per_node = 2;
  }

  // Runs the launcher; returns its exit code.
  int run() {
    const auto start = std::chrono::steady_clock::now();
    const int code = launch::run(options, out, err, log);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return code;
  }

  std::filesystem::path operator/(const std::string& name) const { return dir_ / name; }

  LaunchOptions options;   // /bin/sh running worker.sh, two workers
  std::ostringstream out;  // the workers' stdout, prefixed
  std::ostringstream err;  // the workers' stderr, prefixed
  std::ostringstream log;  // the launcher's messages
  double seconds = 0;      // how long run() took

 private:
  TempDir dir_;
};

// --- the command line --------------------------------------------------------------------------

int no_gpus() {
  return 0;
}

LaunchOptions parse(const std::vector<std::string>& args, int gpus = 0) {
  return parse_launch_args(args, [gpus] { return gpus; }).options;
}

std::string usage_error(const std::vector<std::string>& args, int gpus = 0) {
  try {
    parse(args, gpus);
  } catch (const ArgumentError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(LaunchArgs, Defaults) {
  const auto o = parse({"--", "--config", "x.yaml"});
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_EQ(o.grace_s, 10);
  EXPECT_EQ(o.log_dir, "");
  EXPECT_EQ(o.run_id, "none");
  EXPECT_EQ(o.args, (std::vector<std::string>{"--config", "x.yaml"}));
}

TEST(LaunchArgs, HyphenAndUnderscoreSpellings) {
  const auto o = parse({"--nproc_per_node", "4", "--nnodes=3", "--node_rank=2", "--master_addr",
                        "node0", "--master_port", "1234", "--max_restarts", "5", "--log_dir", "/l",
                        "--grace-period", "2.5", "--", "--config", "a.yaml", "--set", "x_y=1"});
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(o.master_addr, "node0");
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.max_restarts, 5);
  EXPECT_EQ(o.log_dir, "/l");
  EXPECT_EQ(o.grace_s, 2.5);
  // The worker's arguments are passed on untouched, underscores included.
  EXPECT_EQ(o.args, (std::vector<std::string>{"--config", "a.yaml", "--set", "x_y=1"}));
  EXPECT_EQ(parse({"--nproc-per-node", "2", "--node-rank", "0", "--", "t"}).nproc_per_node, 2);
}

TEST(LaunchArgs, RejectsBadValuesNamingTheFlag) {
  EXPECT_TRUE(Contains(usage_error({"--nnodes", "2", "--node-rank", "2", "--", "t"}),
                       "--node-rank 2 is out of range for --nnodes 2"));
  EXPECT_TRUE(Contains(usage_error({"--node_rank", "1", "--", "t"}), "--node-rank"));
  EXPECT_TRUE(Contains(usage_error({"--nproc-per-node", "0", "--", "t"}), "--nproc-per-node"));
  EXPECT_TRUE(Contains(usage_error({"--nproc-per-node", "two", "--", "t"}), "--nproc-per-node"));
  EXPECT_TRUE(Contains(usage_error({"--master-port", "70000", "--", "t"}), "--master-port"));
  EXPECT_TRUE(Contains(usage_error({"--master-port", "0", "--", "t"}), "--master-port"));
  EXPECT_TRUE(Contains(usage_error({"--max-restarts", "-1", "--", "t"}), "--max-restarts"));
  EXPECT_TRUE(Contains(usage_error({"--grace-period", "soon", "--", "t"}), "--grace-period"));
  EXPECT_TRUE(Contains(usage_error({"--nproc-per-node", "gpu", "--", "t"}), "gpu"));
  EXPECT_TRUE(Contains(usage_error({"--standalone", "--nnodes", "2", "--", "t"}), "--standalone"));
  EXPECT_TRUE(Contains(usage_error({"--frobnicate", "--", "t"}), "frobnicate"));
  EXPECT_TRUE(Contains(usage_error({"stray", "--", "t"}), "stray"));
  // The trainer's arguments are required, after "--".
  EXPECT_TRUE(Contains(usage_error({"--nproc-per-node", "2"}), "no trainer arguments"));
  EXPECT_TRUE(Contains(usage_error({"--nproc-per-node", "2", "--"}), "no trainer arguments"));
  EXPECT_TRUE(Lacks(usage_error({"--config", "x.yaml"}), "(accepted)"));
}

TEST(LaunchArgs, NprocAutoGpuCpu) {
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(parse({"--nproc-per-node", "auto", "--", "t"}, /*gpus=*/4).nproc_per_node, 4);
  // auto without a GPU: one process, as `trainer --nproc-per-node auto` (cpu: one per CPU).
  EXPECT_EQ(parse({"--nproc-per-node", "auto", "--", "t"}, /*gpus=*/0).nproc_per_node, 1);
  EXPECT_EQ(parse({"--nproc-per-node", "gpu", "--", "t"}, /*gpus=*/3).nproc_per_node, 3);
  EXPECT_EQ(parse({"--nproc-per-node", "cpu", "--", "t"}, /*gpus=*/3).nproc_per_node, cpus);
  // The GPUs are counted only when asked for.
  bool counted = false;
  parse_launch_args({"--nproc-per-node", "2", "--", "t"}, [&] {
    counted = true;
    return 1;
  });
  EXPECT_FALSE(counted);
}

// Sets the variables while alive (and unsets the scheduler variables it does not name), then
// restores them.
using Vars = std::map<std::string, std::string>;

class Env {
 public:
  explicit Env(const Vars& values) {
    for (const char* name :
         {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
          "PET_MAX_RESTARTS", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"}) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      ::unsetenv(name);
    }
    for (const auto& [name, value] : values) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~Env() {
    for (const auto& [name, value] : saved_) {
      value ? ::setenv(name.c_str(), value->c_str(), 1) : ::unsetenv(name.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST(LaunchArgs, TakesATrainJobsPetVariablesFlagsWin) {
  const Env env(Vars{{"PET_NNODES", "2"},
                     {"PET_NPROC_PER_NODE", "3"},
                     {"PET_NODE_RANK", "1"},
                     {"PET_MASTER_ADDR", "job-node-0-0.job"},
                     {"PET_MASTER_PORT", "29400"}});
  const auto o = parse({"--", "--config", "x.yaml"});
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.nproc_per_node, 3);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "job-node-0-0.job");
  EXPECT_EQ(o.master_port, 29400);
  ASSERT_EQ(o.from_environment.size(), 5u);
  EXPECT_EQ(o.from_environment[1], "--nnodes 2 from PET_NNODES");
  const auto flags = parse({"--nnodes", "4", "--node-rank", "3", "--", "t"});
  EXPECT_EQ(flags.nnodes, 4);
  EXPECT_EQ(flags.node_rank, 3);
  EXPECT_EQ(flags.master_port, 29400);  // not given: still the variable's
  // --standalone reads none of them.
  EXPECT_EQ(parse({"--standalone", "--", "t"}).nnodes, 1);
}

TEST(LaunchArgs, TakesAVolcanoOrPyTorchJobPodsLayout) {
  const Env env(Vars{{"WORLD_SIZE", "3"},
                     {"RANK", "2"},
                     {"MASTER_ADDR", "job-master-0"},
                     {"MASTER_PORT", "23456"}});
  const auto o = parse({"--nproc-per-node", "2", "--", "t"});
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(o.master_addr, "job-master-0");
  EXPECT_EQ(o.master_port, 23456);
  EXPECT_TRUE(Contains(o.from_environment[0], "WORLD_SIZE"));
  // A worker's environment (LOCAL_RANK set) is no pod's layout.
  const Env worker(
      Vars{{"WORLD_SIZE", "3"}, {"RANK", "2"}, {"MASTER_ADDR", "m"}, {"LOCAL_RANK", "0"}});
  EXPECT_EQ(parse({"--", "t"}).nnodes, 1);
}

TEST(LaunchArgs, ABadVariableIsNamed) {
  const Env env(Vars{{"PET_NNODES", "two"}});
  EXPECT_TRUE(Contains(usage_error({"--", "t"}), "PET_NNODES (for --nnodes): expected an integer"));
  const Env rank(Vars{{"PET_NNODES", "2"}, {"PET_NODE_RANK", "2"}});
  EXPECT_TRUE(Contains(usage_error({"--", "t"}), "out of range"));
}

TEST(LaunchArgs, StandalonePicksAFreePortAndARunId) {
  const auto o = parse({"--standalone", "--nproc-per-node", "2", "--", "t"});
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_GT(o.master_port, 0);
  EXPECT_LE(o.master_port, 65535);
  EXPECT_NE(o.master_port, 29500);
  EXPECT_NE(o.run_id, "none");
  EXPECT_EQ(o.run_id.size(), 32u);
  EXPECT_GT(free_port(), 0);
}

TEST(LaunchArgs, Help) {
  EXPECT_TRUE(parse_launch_args({"--help"}, no_gpus).help);
  EXPECT_TRUE(parse_launch_args({"-h"}, no_gpus).help);
  const std::string help = launch_help();
  EXPECT_TRUE(Contains(help, "trainer launch [options] -- <trainer arguments>"));
  EXPECT_TRUE(Contains(help, "--nproc-per-node"));
  EXPECT_TRUE(Contains(help, "--standalone"));
  EXPECT_TRUE(Contains(help, "TORCHELASTIC_RESTART_COUNT"));
}

TEST(Launcher, RejectsInconsistentOptions) {
  LaunchOptions o;
  o.program = "/bin/true";
  o.nnodes = 2;
  o.node_rank = 2;
  std::ostringstream sink;
  EXPECT_THROW(run(o, sink, sink, sink), std::invalid_argument);
  o.node_rank = 0;
  o.program.clear();
  EXPECT_THROW(run(o, sink, sink, sink), std::invalid_argument);
}

TEST(Launcher, SignalNames) {
  EXPECT_EQ(signal_name(SIGKILL), "SIGKILL");
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
}

// --- workers -----------------------------------------------------------------------------------

TEST(Launcher, WorkersGetTheTorchrunEnvironment) {
  Launch launch("env > \"$dir/env_$RANK.tmp\" && mv \"$dir/env_$RANK.tmp\" \"$dir/env_$RANK\"\n");
  launch.options.nnodes = 2;
  launch.options.node_rank = 1;
  launch.options.master_addr = "10.1.2.3";
  launch.options.master_port = 1234;
  launch.options.max_restarts = 3;
  launch.options.run_id = "run-42";
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const std::string saved_omp = omp ? omp : "";
  ::unsetenv("OMP_NUM_THREADS");
  ::setenv("TRAINER_LAUNCH_TEST", "inherited", /*overwrite=*/1);
  const int code = launch.run();
  if (omp) ::setenv("OMP_NUM_THREADS", saved_omp.c_str(), /*overwrite=*/1);
  ::unsetenv("TRAINER_LAUNCH_TEST");
  ASSERT_EQ(code, 0) << launch.log.str();
  EXPECT_TRUE(Contains(launch.log.str(), "OMP_NUM_THREADS"));

  for (int local = 0; local < 2; ++local) {
    const int rank = 2 + local;
    std::map<std::string, std::string> env;
    std::istringstream lines(read_text(launch / ("env_" + std::to_string(rank))));
    for (std::string line; std::getline(lines, line);) {
      const auto eq = line.find('=');
      if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], "1");
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(env["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(env["ROLE_WORLD_SIZE"], "4");
    EXPECT_EQ(env["MASTER_ADDR"], "10.1.2.3");
    EXPECT_EQ(env["MASTER_PORT"], "1234");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "3");
    EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "run-42");
    EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
    EXPECT_EQ(env["TRAINER_LAUNCH_TEST"], "inherited");
  }
}

TEST(Launcher, PrefixesOutputAndWritesTheLogDir) {
  Launch launch(
      "echo \"hello from $RANK\"\n"
      "echo \"error from $RANK\" >&2\n"
      "if [ \"$RANK\" = 1 ]; then seq 1 3000; fi\n"
      "printf 'no newline %s' \"$RANK\"\n");
  launch.options.log_dir = (launch / "logs").string();
  ASSERT_EQ(launch.run(), 0) << launch.log.str();

  const std::string out = launch.out.str();
  const std::string err = launch.err.str();
  EXPECT_TRUE(Contains(out, "[rank0]: hello from 0\n"));
  EXPECT_TRUE(Contains(out, "[rank1]: hello from 1\n"));
  EXPECT_TRUE(Contains(out, "[rank0]: no newline 0\n"));
  // Rank 1's stdout lines arrive whole and in order.
  std::vector<std::string> rank1{"hello from 1"};
  for (int i = 1; i <= 3000; ++i) rank1.push_back(std::to_string(i));
  rank1.push_back("no newline 1");
  EXPECT_EQ(lines_with_prefix(out, "[rank1]: "), rank1);
  EXPECT_TRUE(Lacks(out, "error from"));
  EXPECT_TRUE(Contains(err, "[rank0]: error from 0\n"));
  EXPECT_TRUE(Contains(err, "[rank1]: error from 1\n"));
  EXPECT_EQ(count(out, "\n"), count(out, "[rank")) << "every line has its prefix";

  const std::string rank0 = read_text(launch / "logs/rank_0.log");
  EXPECT_TRUE(Contains(rank0, "hello from 0\n"));
  EXPECT_TRUE(Contains(rank0, "error from 0\n"));
  EXPECT_TRUE(Contains(rank0, "no newline 0\n"));
  EXPECT_TRUE(Lacks(rank0, "[rank"));
  EXPECT_EQ(count(read_text(launch / "logs/rank_1.log"), "\n"), 3003);
}

// --local-ranks-filter 1 --no-prefix: the console shows rank 1's lines as it printed them; the
// log files keep every rank's, and rank_<N>.stdout holds a rank's stdout alone.
TEST(Launcher, FiltersRanksAndDropsThePrefix) {
  Launch launch(
      "echo \"{\\\"rank\\\": $RANK}\"\n"
      "echo \"note from $RANK\" >&2\n");
  launch.options.log_dir = (launch / "logs").string();
  launch.options.local_ranks_filter = {1};
  launch.options.prefix = false;
  ASSERT_EQ(launch.run(), 0) << launch.log.str();
  EXPECT_EQ(launch.out.str(), "{\"rank\": 1}\n");
  EXPECT_EQ(launch.err.str(), "note from 1\n");
  EXPECT_TRUE(Contains(read_text(launch / "logs/rank_0.log"), "note from 0\n"));
  EXPECT_EQ(read_text(launch / "logs/rank_0.stdout"), "{\"rank\": 0}\n");
  EXPECT_EQ(read_text(launch / "logs/rank_1.stdout"), "{\"rank\": 1}\n");
}

TEST(LaunchArgs, LocalRanksFilterAndNoPrefix) {
  const auto o =
      parse({"--nproc-per-node", "3", "--local-ranks-filter", "0,2", "--no-prefix", "--", "t"}, 0);
  EXPECT_EQ(o.local_ranks_filter, (std::vector<int>{0, 2}));
  EXPECT_FALSE(o.prefix);
  EXPECT_TRUE(parse({"--", "t"}, 0).prefix);
  EXPECT_TRUE(
      Contains(usage_error({"--nproc-per-node", "2", "--local-ranks-filter", "2", "--", "t"}),
               "--local-ranks-filter: local rank 2 is out of range"));
  EXPECT_TRUE(
      Contains(usage_error({"--local-ranks-filter", "x", "--", "t"}), "--local-ranks-filter"));
}

TEST(Launcher, FailureStopsTheOtherWorkersAtOnce) {
  Launch launch(write_pid("pid_$RANK") +
                "if [ \"$RANK\" = 1 ]; then\n"
                "  while [ ! -f \"$dir/sleep_0\" ]; do sleep 0.01; done\n"
                "  echo 'first words'; echo 'last words' >&2; exit 3\n"
                "fi\n"
                "sleep 60 &\n" +
                publish("sleep_0", "$!") + "wait\n");
  EXPECT_EQ(launch.run(), 1);
  EXPECT_LT(launch.seconds, 5.0) << "the sleeping worker was not stopped by SIGTERM";
  const std::string log = launch.log.str();
  const pid_t failed = read_pid(launch / "pid_1");
  EXPECT_TRUE(Contains(log, "trainer launch: rank 1 (local rank 1, pid " + std::to_string(failed) +
                                ") failed: exit code 3\n"));
  EXPECT_TRUE(Contains(log, "  | first words\n"));
  EXPECT_TRUE(Contains(log, "  | last words\n"));
  EXPECT_TRUE(Lacks(log, "restarting"));
  EXPECT_TRUE(Lacks(log, "rank 0 (local rank 0"));  // stopped, not failed
  EXPECT_TRUE(process_gone(read_pid(launch / "pid_0")));
  EXPECT_TRUE(process_gone(read_pid(launch / "sleep_0"))) << "the worker's child was left behind";
}

TEST(Launcher, WorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  Launch launch("trap '' TERM\n" + write_pid("pid_$RANK") +
                "if [ \"$RANK\" = 1 ]; then\n"
                "  while [ ! -f \"$dir/pid_0\" ]; do sleep 0.01; done\n"
                "  exit 1\n"
                "fi\n"
                "sleep 60\n");
  launch.options.grace_s = 1;
  EXPECT_EQ(launch.run(), 1);
  EXPECT_GE(launch.seconds, 0.9);
  EXPECT_LT(launch.seconds, 5.0);
  EXPECT_TRUE(Contains(launch.log.str(), "still running 1 s after SIGTERM; sending SIGKILL"));
  EXPECT_TRUE(process_gone(read_pid(launch / "pid_0")));
}

// Rank 1 fails on the first attempt; both ranks succeed on the second.
const char* kFailsOnce =
    "echo \"attempt $TORCHELASTIC_RESTART_COUNT of run $TORCHELASTIC_RUN_ID\" >> "
    "\"$dir/marker_$RANK\"\n"
    "echo \"output of attempt $TORCHELASTIC_RESTART_COUNT\"\n"
    "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then\n"
    "  if [ \"$RANK\" = 1 ]; then exit 1; fi\n"
    "  sleep 60\n"
    "fi\n";

TEST(Launcher, RestartsTheGroupAfterAFailure) {
  Launch launch(kFailsOnce);
  launch.options.max_restarts = 1;
  launch.options.run_id = "run-7";
  launch.options.log_dir = (launch / "logs").string();
  EXPECT_EQ(launch.run(), 0) << launch.log.str();
  EXPECT_EQ(read_text(launch / "marker_1"), "attempt 0 of run run-7\nattempt 1 of run run-7\n");
  EXPECT_TRUE(Contains(read_text(launch / "marker_0"), "attempt 1 of run run-7\n"));
  EXPECT_TRUE(
      Contains(launch.log.str(), "trainer launch: restarting the workers (restart 1 of 1)"));
  EXPECT_LT(launch.seconds, 10.0);
  const std::string rank1 = read_text(launch / "logs/rank_1.log");
  const auto first = rank1.find("output of attempt 0");
  const auto separator = rank1.find("----- trainer launch: restart 1 of 1, run id run-7 -----\n");
  const auto second = rank1.find("output of attempt 1");
  ASSERT_NE(first, std::string::npos) << rank1;
  ASSERT_NE(separator, std::string::npos) << rank1;
  ASSERT_NE(second, std::string::npos) << rank1;
  EXPECT_LT(first, separator);
  EXPECT_LT(separator, second);
}

TEST(Launcher, FailsWhenNoRestartsAreLeft) {
  Launch launch(kFailsOnce);
  EXPECT_EQ(launch.run(), 1);
  EXPECT_EQ(read_text(launch / "marker_1"), "attempt 0 of run none\n");
  EXPECT_TRUE(Lacks(launch.log.str(), "restarting"));
}

TEST(Launcher, ExitCode2IsNotRestarted) {
  Launch launch("echo attempt >> \"$dir/marker_$RANK\"\nexit 2\n");
  launch.options.nproc_per_node = 1;
  launch.options.max_restarts = 3;
  EXPECT_EQ(launch.run(), 2);
  EXPECT_EQ(read_text(launch / "marker_0"), "attempt\n");
  EXPECT_TRUE(Contains(launch.log.str(), "failed: exit code 2"));
  EXPECT_TRUE(Contains(launch.log.str(), "not restarting"));
  EXPECT_TRUE(Lacks(launch.log.str(), "restarting the workers"));
}

TEST(Launcher, WorkerKilledWithSigkill) {
  Launch launch("sleep 60 &\n" + publish("sleep_$RANK", "$!") + write_pid("pid_$RANK") + "wait\n");
  std::thread killer([&] {
    if (wait_for_file(launch / "pid_0") && wait_for_file(launch / "pid_1")) {
      ::kill(read_pid(launch / "pid_1"), SIGKILL);
    }
  });
  const int code = launch.run();
  killer.join();
  EXPECT_EQ(code, 1);
  EXPECT_LT(launch.seconds, 5.0);
  EXPECT_TRUE(Contains(launch.log.str(), "trainer launch: rank 1 (local rank 1, pid " +
                                             std::to_string(read_pid(launch / "pid_1")) +
                                             ") failed: killed by signal SIGKILL (9)\n"));
  EXPECT_TRUE(process_gone(read_pid(launch / "pid_0")));
  EXPECT_TRUE(process_gone(read_pid(launch / "sleep_0")));
  EXPECT_TRUE(process_gone(read_pid(launch / "sleep_1"))) << "the killed worker's child was left";
}

TEST(Launcher, ForwardsSigtermAndExitsZeroWhenTheWorkersDo) {
  Launch launch(
      "trap 'echo \"stopping $RANK\"; echo stopped > \"$dir/stopped_$RANK\"; exit 0' TERM\n" +
      write_pid("pid_$RANK") + "sleep 60 &\nwait\n");
  launch.options.max_restarts = 2;
  std::thread stopper([&] {
    if (wait_for_file(launch / "pid_0") && wait_for_file(launch / "pid_1")) {
      ::kill(::getpid(), SIGTERM);  // the launcher's handler is installed while it runs
    }
  });
  const int code = launch.run();
  stopper.join();
  EXPECT_EQ(code, 0) << launch.log.str();
  EXPECT_LT(launch.seconds, 5.0);
  EXPECT_TRUE(Contains(launch.log.str(), "got SIGTERM; passing it to the workers"));
  EXPECT_TRUE(Lacks(launch.log.str(), "restarting"));
  EXPECT_TRUE(Contains(launch.out.str(), "[rank0]: stopping 0\n"));
  EXPECT_TRUE(Contains(launch.out.str(), "[rank1]: stopping 1\n"));
  EXPECT_TRUE(std::filesystem::exists(launch / "stopped_0"));
  EXPECT_TRUE(std::filesystem::exists(launch / "stopped_1"));
}

TEST(Launcher, SecondSignalKillsTheWorkers) {
  Launch launch("trap '' TERM INT\n" + write_pid("pid_$RANK") + "sleep 60\n");
  launch.options.max_restarts = 2;
  std::thread stopper([&] {
    if (wait_for_file(launch / "pid_0") && wait_for_file(launch / "pid_1")) {
      ::kill(::getpid(), SIGTERM);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ::kill(::getpid(), SIGINT);
    }
  });
  const int code = launch.run();
  stopper.join();
  EXPECT_EQ(code, 1);
  EXPECT_LT(launch.seconds, 5.0) << "grace is 10 s: the second signal must not wait for it";
  EXPECT_TRUE(Contains(launch.log.str(), "got SIGINT again; killing the workers"));
  EXPECT_TRUE(Lacks(launch.log.str(), "restarting"));
  EXPECT_TRUE(process_gone(read_pid(launch / "pid_0")));
  EXPECT_TRUE(process_gone(read_pid(launch / "pid_1")));
}

// A launcher killed with SIGKILL takes its workers along (PR_SET_PDEATHSIG). The launcher runs in a
// fork of the test process, which is made a subreaper so that it can reap the orphaned workers.
TEST(Launcher, WorkersDieWithTheLauncher) {
  Launch launch(write_pid("pid_$RANK") + "exec sleep 60\n");
  // The test process is a subreaper for this test only.
  struct Subreaper {
    Subreaper() {
      ::prctl(PR_GET_CHILD_SUBREAPER, &previous);
      ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    }
    ~Subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, previous); }
    int previous = 0;  // the setting to restore
  } subreaper;
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) ::_exit(launch.run());
  const bool started = wait_for_file(launch / "pid_0") && wait_for_file(launch / "pid_1");
  ::kill(launcher, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  ASSERT_TRUE(started);
  for (const char* name : {"pid_0", "pid_1"}) {
    const pid_t worker = read_pid(launch / name);
    pid_t reaped = 0;
    for (int i = 0; i < 500 && reaped == 0; ++i) {
      reaped = ::waitpid(worker, &status, WNOHANG);
      if (reaped == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (reaped == 0) {  // still alive after 5 s: clean up, then fail
      ::kill(worker, SIGKILL);
      ::waitpid(worker, &status, 0);
    }
    ASSERT_EQ(reaped, worker) << name << " outlived its launcher";
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << name;
  }
}

TEST(Launcher, MissingProgramIsAFailure) {
  Launch launch("exit 0\n");
  launch.options.program = (launch / "no_such_program").string();
  launch.options.max_restarts = 2;
  EXPECT_EQ(launch.run(), 1);
  EXPECT_TRUE(Contains(launch.log.str(), "rank 0 (local rank 0) failed to start: cannot execute '" +
                                             launch.options.program +
                                             "': No such file or directory"));
  EXPECT_TRUE(Lacks(launch.log.str(), "restarting the workers"));
}

}  // namespace
}  // namespace trainer::launch
