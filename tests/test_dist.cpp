// Data-parallel training between real trainer processes over Gloo: equivalence with one
// process at the global batch, every way of starting a job, and the faults a job meets.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>

#include "cli_fixture.h"
#include "distributed/failure_text.h"
#include "util/net/net.h"

namespace {

using trainer::test_support::Cli;
using trainer::test_support::read_file;
using trainer::test_support::step_file;
namespace fs = std::filesystem;

using trainer::free_port;

// The largest |a - b| over the model tensors of two checkpoints.
double model_max_abs_diff(const fs::path& a, const fs::path& b) {
  return trainer::test_support::max_abs_diff(a, b, "model.");
}

// Plain SGD on Fashion-MNIST without dropout: 2 x B and 1 x 2B see the same samples per step.
// (At lr 0.05 lenet's rounding differences grow from 4e-8 at step 10 to 3e-4 at step 20 as
// ReLU/max-pool decisions flip; at 0.01 they stay below 1e-6.)
std::string recipe(const std::string& config, int steps) {
  return "--config configs/" + config +
         " --set model.dropout=0 --set optim.name=sgd --set optim.lr=0.01 "
         "--set optim.momentum=0.9 --set optim.weight_decay=0 --set sched.name=constant "
         "--set sched.warmup_steps=0 --set train.max_steps=" +
         std::to_string(steps) +
         " --set data.workers=1 --set run.log_every=5 --set run.progress=never "
         "--set train.eval_at_end=false --set run.threads=1";
}

class Dist : public Cli {
 protected:
  // `trainer launch` with its flags, then the trainer's arguments.
  trainer::test_support::Result launch(const std::string& flags, const std::string& args) {
    return run("launch --standalone " + flags + " -- " + args);
  }
};

TEST_F(Dist, TwoProcessesEqualOneProcessAtTheGlobalBatch) {
  for (const std::string config : {"fashion_mnist_mlp.yaml", "fashion_mnist_lenet.yaml"}) {
    for (const int accum : {1, 2}) {
      SCOPED_TRACE(config + " accum " + std::to_string(accum));
      const std::string common =
          recipe(config, 20) + " --set train.grad_accum_steps=" + std::to_string(accum);
      const fs::path one = dir_ / "one", two = dir_ / "two";
      ASSERT_EQ(run(common + " --set data.batch_size=32 --run-dir '" + one.string() + "'").code, 0);
      const auto r = launch("--nproc-per-node 2",
                            common + " --set data.batch_size=16 --run-dir '" + two.string() + "'");
      ASSERT_EQ(r.code, 0) << r.out << r.err;
      EXPECT_NE(r.err.find("[rank0]: "), std::string::npos) << r.err;
      // The log names what started the job and how the ranks share the model.
      const std::string all = r.out + r.err;
      EXPECT_NE(all.find("started by trainer launch), ddp (replicated weights)"), std::string::npos)
          << all;
      const double diff = model_max_abs_diff(one / "checkpoints" / step_file(20),
                                             two / "checkpoints" / step_file(20));
      EXPECT_LE(diff, 1e-5);
      // The logged losses are averages over the ranks: those of the global batch.
      const auto la = losses(one), lb = losses(two);
      ASSERT_EQ(la.size(), lb.size());
      for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-5);
      // Only rank 0 wrote the run dir: one line per log step.
      EXPECT_EQ(lb.size(), 4u);
      fs::remove_all(one);
      fs::remove_all(two);
    }
  }
}

// Batch norm: with dist.sync_bn the statistics are those of the global batch, so 2 x B trains
// as 1 x 2B does up to rounding (which batch norm amplifies; the float64 check of the algorithm
// is in test_batch_norm.cpp); without it each rank normalises its own half.
TEST_F(Dist, BenchUnderTheLauncherCountsEveryRanksSamples) {
  const auto json = dir_ / "bench.json";
  const auto r = launch("--nproc-per-node 2",
                        "bench --config configs/synthetic.yaml --steps 4 --warmup 1 "
                        "--set run.threads=1 --json '" +
                            json.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(read_file(json));
  EXPECT_EQ(j["world_size"], 2);
  // configs/synthetic.yaml: 32 samples per rank and step.
  EXPECT_NEAR(j["samples_per_sec"].get<double>(), 2 * 4 * 32 / j["seconds"].get<double>(), 1e-6);
  EXPECT_GE(j["phases_ms"]["grad_sync"].get<double>(), 0.0);
  // Only rank 0 reports.
  size_t tables = 0;
  for (size_t at = 0; (at = r.out.find("trainer bench:", at)) != std::string::npos; ++at) ++tables;
  EXPECT_EQ(tables, 1u) << r.out;
}

// doctor --perf under the launcher: the collectives' bus bandwidth over Gloo, by message size,
// the slowest rank's time with nccl-tests' formula; one report, rank 0's.
TEST_F(Dist, DoctorPerfMeasuresTheCollectivesOfAJob) {
  const auto r = launch("--nproc-per-node 2", "doctor --perf --quick --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto start = r.out.find('{');
  ASSERT_NE(start, std::string::npos) << r.out;
  std::string json = r.out.substr(start);
  // The launcher prefixes each line of a worker's output with its rank.
  for (size_t at; (at = json.find("[rank0]: ")) != std::string::npos;) json.erase(at, 9);
  const auto j = nlohmann::json::parse(json);
  std::set<int64_t> reduce_sizes;
  for (const auto& c : j["collectives"]) {
    EXPECT_GT(c["busbw_gbps"].get<double>(), 0.0) << c;
    const double algbw = c["bytes"].get<double>() / c["seconds"].get<double>() / 1e9;
    const double factor = c["collective"] == "all_reduce" ? 1.0 : 0.5;  // 2(n-1)/n, (n-1)/n
    EXPECT_NEAR(c["busbw_gbps"].get<double>(), algbw * factor, 1e-9 * algbw) << c;
    if (c["collective"] == "all_reduce") reduce_sizes.insert(c["message_bytes"].get<int64_t>());
  }
  EXPECT_EQ(*reduce_sizes.begin(), 1024);
  EXPECT_EQ(*reduce_sizes.rbegin(), int64_t{64} << 20);
  bool transport = false;
  for (const auto& row : j["rows"]) transport = transport || row["name"] == "transport";
  EXPECT_TRUE(transport) << j["rows"];
  EXPECT_EQ(r.out.find("[rank1]: {"), std::string::npos) << r.out;
}

// trainer eval under the launcher: 127 validation samples over 2 and 3 ranks are each scored
// once; the figures equal one process's within the float32 rounding of other batch sums.
TEST_F(Dist, EvalCountsEverySampleOnceOverTheRanks) {
  const auto run_dir = dir_ / "r";
  const std::string config =
      "--config configs/synthetic.yaml --set data.noise=4 "
      "--set data.val_samples=127 --set run.progress=never";
  ASSERT_EQ(run(config + " --run-dir '" + run_dir.string() + "'").code, 0);
  const auto alone =
      nlohmann::json::parse(run("eval --checkpoint '" + run_dir.string() + "' --json").out);
  for (const char* ranks : {"2", "3"}) {
    const auto r = launch(std::string("--nproc-per-node ") + ranks,
                          "eval --checkpoint '" + run_dir.string() + "' --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto e = nlohmann::json::parse(r.out.substr(r.out.find('{')));
    EXPECT_EQ(e["samples"], 127) << ranks;
    EXPECT_NEAR(e["loss"].get<double>(), alone["loss"].get<double>(),
                1e-6 * alone["loss"].get<double>());
    EXPECT_DOUBLE_EQ(e["top1"].get<double>(), alone["top1"].get<double>());
  }
}

TEST_F(Dist, SyncBatchNormTrainsAsTheGlobalBatch) {
  const std::string common =
      "--config configs/synthetic.yaml --set model.name=resnet18 --set model.stem=cifar "
      "--set data.shape=[3,16,16] --set data.noise=4 --set optim.lr=0.01 --set optim.momentum=0.9 "
      "--set train.max_steps=5 "
      "--set run.progress=never --set train.eval_at_end=false --set run.threads=1 "
      "--set deterministic=false";
  const fs::path one = dir_ / "one", sync = dir_ / "sync", local = dir_ / "local";
  ASSERT_EQ(run(common + " --set data.batch_size=16 --run-dir '" + one.string() + "'").code, 0);
  auto r = launch("--nproc-per-node 2", common +
                                            " --set dist.sync_bn=true --set data.batch_size=8 "
                                            "--run-dir '" +
                                            sync.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  r = launch("--nproc-per-node 2",
             common + " --set data.batch_size=8 --run-dir '" + local.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto last = one / "checkpoints" / step_file(5);
  const double synced = model_max_abs_diff(last, sync / "checkpoints" / step_file(5));
  const double unsynced = model_max_abs_diff(last, local / "checkpoints" / step_file(5));
  std::cout << "resnet18, 5 steps, max |w(1 x 16) - w(2 x 8)|: sync_bn " << synced
            << ", per-rank batch norm " << unsynced << "\n";
  EXPECT_LE(synced, 5e-3);
  EXPECT_GT(unsynced, 20 * synced);
}

// A job of one process (no reducer by default; with it when asked) trains bit for bit as a plain
// run: ResNet-18 with dist.sync_bn (plain batch norm alone) and gradient accumulation (no_sync).
TEST_F(Dist, AJobOfOneTrainsAsAPlainRun) {
  const std::string common =
      "--config configs/synthetic.yaml --set model.name=resnet18 --set model.stem=cifar "
      "--set data.shape=[3,8,8] --set model.dropout=0 --set train.max_steps=3 "
      "--set data.batch_size=4 --set train.grad_accum_steps=2 --set dist.sync_bn=true "
      "--set run.progress=never --set train.eval_at_end=false --set run.threads=1";
  const fs::path plain = dir_ / "plain";
  ASSERT_EQ(run(common + " --run-dir '" + plain.string() + "'").code, 0);
  for (const bool reducer : {false, true}) {
    SCOPED_TRACE(reducer ? "with the reducer" : "without the reducer");
    const fs::path one = dir_ / (reducer ? "reducer" : "alone");
    const auto r = launch("--nproc-per-node 1", common + " --set dist.reducer_at_world_size_1=" +
                                                    (reducer ? "true" : "false") + " --run-dir '" +
                                                    one.string() + "'");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(model_max_abs_diff(plain / "checkpoints" / step_file(3),
                                 one / "checkpoints" / step_file(3)),
              0.0);
  }
}

// Activation checkpointing inside DDP: a block's parameters get their gradients when its
// recomputation ends, the reducer's hooks fire then, and the result is bit for bit the plain one.
TEST_F(Dist, CheckpointedBlocksTrainAsPlainOnes) {
  const std::string common =
      "--config configs/synthetic.yaml --set model.name=resnet18 --set model.stem=cifar "
      "--set data.shape=[3,8,8] --set model.dropout=0 --set train.max_steps=3 "
      "--set data.batch_size=8 --set run.progress=never --set train.eval_at_end=false "
      "--set run.threads=1";
  const fs::path plain = dir_ / "plain", blocks = dir_ / "blocks";
  auto r = launch("--nproc-per-node 2", common + " --run-dir '" + plain.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  r = launch("--nproc-per-node 2",
             common + " --set model.checkpointing=blocks --run-dir '" + blocks.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(model_max_abs_diff(plain / "checkpoints" / step_file(3),
                               blocks / "checkpoints" / step_file(3)),
            0.0);
}

TEST_F(Dist, EveryWayOfStartingAJobFormsTheSameGroup) {
  const std::string args = recipe("fashion_mnist_mlp.yaml", 10) + " --set data.batch_size=16";
  auto final_weights = [&](const std::string& name) {
    return dir_ / name / "checkpoints" / step_file(10);
  };
  const auto base =
      launch("--nproc-per-node 2", args + " --run-dir '" + (dir_ / "a").string() + "'");
  ASSERT_EQ(base.code, 0) << base.err;

  // Two "nodes" on loopback, one process each, one master.
  const std::string port = std::to_string(free_port());
  auto r =
      sh("for n in 0 1; do \"$TRAINER\" launch --nnodes 2 --node-rank $n --nproc-per-node 1 "
         "--master-addr 127.0.0.1 --master-port " +
         port + " -- " + args + " --run-dir '" + (dir_ / "b").string() +
         "' & pids+=($!); done; wait ${pids[0]} && wait ${pids[1]}");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(model_max_abs_diff(final_weights("a"), final_weights("b")), 0.0);

  // SLURM's variables, set by hand as srun would.
  r =
      sh("for n in 0 1; do SLURM_PROCID=$n SLURM_LOCALID=$n SLURM_NTASKS=2 "
         "SLURM_TASKS_PER_NODE=2 SLURM_JOB_NODELIST=127.0.0.1 MASTER_PORT=" +
         std::to_string(free_port()) + " \"$TRAINER\" " + args + " --run-dir '" +
         (dir_ / "c").string() + "' & pids+=($!); done; wait ${pids[0]} && wait ${pids[1]}");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(model_max_abs_diff(final_weights("a"), final_weights("c")), 0.0);

  // torchrun from the project's virtual environment.
  const fs::path torchrun = fs::path(TRAINER_VENV_DIR) / "bin" / "torchrun";
  if (!fs::exists(torchrun)) GTEST_SKIP() << "no " << torchrun;
  r = sh("'" + torchrun.string() + "' --standalone --nproc-per-node 2 --no-python \"$TRAINER\" " +
         args + " --run-dir '" + (dir_ / "d").string() + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(model_max_abs_diff(final_weights("a"), final_weights("d")), 0.0);
}

// A job long enough to be hit mid-training, checkpointing every 5 steps.
std::string long_job(const fs::path& run_dir, int steps) {
  return recipe("fashion_mnist_mlp.yaml", steps) +
         " --set data.batch_size=16 --set run.checkpoint_every=5 --set run.log_every=5 "
         "--run-dir '" +
         run_dir.string() + "'";
}

// Bash: waits (60 s at most) until the run dir has logged step `step`.
std::string wait_for_step(const fs::path& run_dir, int step) {
  return "for i in $(seq 600); do grep -Eq '\"step\":" + std::to_string(step) + "[,}]' '" +
         (run_dir / "metrics.jsonl").string() + "' 2>/dev/null && break; sleep 0.1; done\n";
}

// Bash: waits until the run dir logged step `step`, then kills one of $L's workers with -9.
std::string kill_a_worker(const fs::path& run_dir, int step) {
  return wait_for_step(run_dir, step) + "victim=$(pgrep -P $L | tail -1); kill -9 $victim\n";
}

// Bash: waits (60 s at most) until something listens on TCP port `port` of this host.
std::string wait_for_listener(const std::string& port) {
  return "for i in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/" + port +
         ") 2>/dev/null && break; sleep 0.1; done\n";
}

// A step's failure in a group, from a Group collective's error (its own cause given) or from
// Gloo directly: one line, the cause once, no library source path; other brackets kept.
TEST(StepFailureLine, SaysTheCauseOnceWithoutTheLibrarysSourcePath) {
  using trainer::distributed::step_failure_line;
  const std::string gloo =
      "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error "
      "[127.0.0.1]:29500: Connection reset by peer";
  const std::string group = "rank 0: all_reduce across 2 ranks failed: " + gloo +
                            " (another rank ended or is stuck; dist.timeout_s is 600 s)";
  EXPECT_EQ(step_failure_line(0, 12, group, 600),
            "rank 0: step 12 failed: all_reduce across 2 ranks failed: Read error "
            "[127.0.0.1]:29500: Connection reset by peer (another rank ended or is stuck; "
            "dist.timeout_s is 600 s)");
  EXPECT_EQ(step_failure_line(1, 3, gloo, 2.5),
            "rank 1: step 3 failed: Read error [127.0.0.1]:29500: Connection reset by peer (when "
            "another rank has ended or is stuck, collectives fail after dist.timeout_s, 2.5 s)");
  EXPECT_EQ(trainer::without_source_paths("a [x.cc:12] b [/p/q.h:7] c [1, 2]"),
            "a [x.cc:12] b c [1, 2]");
}

TEST_F(Dist, AKilledRankEndsTheJobNamingIt) {
  const fs::path run_dir = dir_ / "run";
  const auto r = sh("\"$TRAINER\" launch --standalone --nproc-per-node 2 --grace-period 5 -- " +
                    long_job(run_dir, 100000) + " & L=$!\n" + kill_a_worker(run_dir, 10) +
                    "start=$(date +%s); wait $L; code=$?; end=$(date +%s)\n"
                    "echo \"code=$code seconds=$((end - start)) left=$(pgrep -f '" +
                    run_dir.string() + "' | wc -l)\"");
  EXPECT_NE(r.out.find("left=0"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("code=0 "), std::string::npos) << r.out;
  const auto seconds = std::stoi(r.out.substr(r.out.rfind("seconds=") + 8));
  EXPECT_LE(seconds, 30);
  EXPECT_NE(r.err.find("failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("SIGKILL"), std::string::npos) << r.err;
  // The surviving rank's line: the library's words without its source paths ("[/.../pair.cc:N]"),
  // the likely cause said once.
  EXPECT_FALSE(std::regex_search(r.err, std::regex(R"(\[[^\]\n]*\.(cc|cpp|h):[0-9]+\])"))) << r.err;
  std::istringstream lines(r.err);
  for (std::string line; std::getline(lines, line);) {
    const auto first = line.find("ended or is stuck");
    if (first == std::string::npos) continue;
    EXPECT_EQ(line.find("ended or is stuck", first + 1), std::string::npos) << line;
  }
}

TEST_F(Dist, ARestartedJobEndsAsAnUninterruptedOne) {
  const fs::path a = dir_ / "a", b = dir_ / "b";
  ASSERT_EQ(launch("--nproc-per-node 2", long_job(a, 40)).code, 0);
  const auto r = sh("\"$TRAINER\" launch --standalone --nproc-per-node 2 --max-restarts 1 -- " +
                    long_job(b, 40) + " & L=$!\n" + kill_a_worker(b, 15) + "wait $L");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("restarting"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resumed from"), std::string::npos) << r.err;
  EXPECT_EQ(
      model_max_abs_diff(a / "checkpoints" / step_file(40), b / "checkpoints" / step_file(40)),
      0.0);
  EXPECT_EQ(losses(a), losses(b));
}

TEST_F(Dist, AMissingRankEndsTheRendezvousWithAMessage) {
  const auto start = std::chrono::steady_clock::now();
  const auto r =
      sh("RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) +
         " \"$TRAINER\" " + recipe("fashion_mnist_mlp.yaml", 5) +
         " --set dist.init_timeout_s=2 --run-dir '" + (dir_ / "run").string() + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("1 of 2 ranks arrived within 2 s (dist.init_timeout_s): missing rank 1 "
                       "(node 0, at 2 processes a node)"),
            std::string::npos)
      << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  // (Without LOCAL_WORLD_SIZE the job is one node.) Two processes a node, three ranks missing: the
  // rest of node 0 and all of node 1.
  const auto four =
      sh("RANK=0 LOCAL_RANK=0 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
         std::to_string(free_port()) + " \"$TRAINER\" " + recipe("fashion_mnist_mlp.yaml", 5) +
         " --set dist.init_timeout_s=2 --run-dir '" + (dir_ / "run4").string() + "'");
  EXPECT_EQ(four.code, 1);
  EXPECT_NE(four.err.find("1 of 4 ranks arrived within 2 s (dist.init_timeout_s): missing ranks "
                          "1-3 (nodes 0,1, at 2 processes a node)"),
            std::string::npos)
      << four.err;
}

TEST_F(Dist, DifferentWorldSizesAreNamed) {
  const std::string port = std::to_string(free_port());
  const auto r =
      sh("RANK=0 WORLD_SIZE=2 MASTER_PORT=" + port + " \"$TRAINER\" " +
         recipe("fashion_mnist_mlp.yaml", 5) + " --set dist.init_timeout_s=3 --run-dir '" +
         (dir_ / "run").string() + "' 2>/dev/null &\n" + wait_for_listener(port) +
         "RANK=1 WORLD_SIZE=3 MASTER_PORT=" + port + " \"$TRAINER\" " +
         recipe("fashion_mnist_mlp.yaml", 5) + " --set dist.init_timeout_s=3 --run-dir '" +
         (dir_ / "run").string() + "'; code=$?; wait; exit $code");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("rank 1 was started with world size 3 but rank 0"), std::string::npos)
      << r.err;
}

TEST_F(Dist, ABusyPortIsNamed) {
  // Something listens on the port already.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  const auto r = sh("RANK=0 WORLD_SIZE=2 MASTER_PORT=" + std::to_string(port) + " \"$TRAINER\" " +
                    recipe("fashion_mnist_mlp.yaml", 5) +
                    " --set dist.init_timeout_s=5 --run-dir '" + (dir_ / "run").string() + "'");
  ::close(fd);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("port " + std::to_string(port)), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("in use"), std::string::npos) << r.err;
}

TEST_F(Dist, AStuckRankEndsTheRunAtTheCollectiveTimeout) {
  const fs::path run_dir = dir_ / "run";
  const auto r = sh("\"$TRAINER\" launch --standalone --nproc-per-node 2 --grace-period 2 -- " +
                    long_job(run_dir, 100000) + " --set dist.timeout_s=3 & L=$!\n" +
                    wait_for_step(run_dir, 10) +
                    "kill -STOP $(pgrep -P $L | tail -1)\n"
                    "start=$(date +%s); wait $L; code=$?; end=$(date +%s)\n"
                    "echo \"code=$code seconds=$((end - start))\"");
  EXPECT_EQ(r.out.find("code=0 "), std::string::npos) << r.out;
  EXPECT_LE(std::stoi(r.out.substr(r.out.rfind("seconds=") + 8)), 30) << r.out;
  EXPECT_NE(r.err.find("dist.timeout_s"), std::string::npos) << r.err;
}

// Each command's --json under trainer launch: with --local-ranks-filter 0 --no-prefix the console
// holds rank 0's JSON as the command printed it, and with --log-dir rank_0.stdout holds it too;
// without the flags every line carries its rank. bench writes its JSON to a file.
TEST_F(Dist, EachCommandsJsonUnderTheLauncherParses) {
  const auto run_dir = dir_ / "r";
  ASSERT_EQ(run("--config configs/synthetic.yaml --set run.progress=never --run-dir '" +
                run_dir.string() + "'")
                .code,
            0);
  const std::string raw = "--nproc-per-node 2 --local-ranks-filter 0 --no-prefix";
  for (const std::string& command :
       std::vector<std::string>{"eval --checkpoint '" + run_dir.string() + "' --json",
                                "doctor --perf --quick --json --config configs/synthetic.yaml",
                                "doctor --json --config configs/synthetic.yaml"}) {
    SCOPED_TRACE(command);
    const fs::path logs = dir_ / ("logs" + std::to_string(command.size()));
    auto r = launch(raw + " --log-dir '" + logs.string() + "'", command);
    ASSERT_LE(r.code, 1) << r.err;  // doctor exits 1 on a FAIL finding
    EXPECT_NO_THROW(nlohmann::json::parse(r.out)) << r.out;
    EXPECT_NO_THROW(nlohmann::json::parse(read_file(logs / "rank_0.stdout")));
    r = launch("--nproc-per-node 2", command);
    EXPECT_NE(r.out.find("[rank0]: {"), std::string::npos) << r.out;
  }
  const fs::path json = dir_ / "bench.json";
  const auto r = launch("--nproc-per-node 2",
                        "bench --config configs/synthetic.yaml --steps 2 "
                        "--warmup 1 --json '" +
                            json.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(read_file(json))["world_size"], 2);
}

// --nproc-per-node: auto means one per GPU, one without a GPU, for `trainer` and `trainer launch`
// alike; a bad value names the flag typed.
TEST_F(Dist, NprocPerNodeAutoHasOneMeaning) {
  const std::string args =
      "--config configs/synthetic.yaml --set train.max_steps=2 "
      "--set run.progress=never";
  if (run("doctor --json").out.find("\"cuda_available\": true") != std::string::npos) {
    GTEST_SKIP() << "this machine has a GPU";
  }
  auto r = launch("--nproc-per-node auto", args + " --run-dir '" + (dir_ / "a").string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("ranks 0..0 of 1"), std::string::npos) << r.err;
  r = run(args + " --nproc-per-node auto --run-dir '" + (dir_ / "b").string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("local job"), std::string::npos) << r.err;
  for (const std::string bad : {"0", "two", "-1"}) {
    r = run(args + " --nproc-per-node " + bad);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("--nproc-per-node: must be a number of processes >= 1 or auto, got '" +
                         bad + "'"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("launch.nproc_per_node"), std::string::npos) << r.err;
  }
}

// A config error under trainer launch: reported once, by the launcher, before any worker starts
// (not by each worker and again in the launcher's failure report); exit 2, as without launch.
TEST_F(Dist, AConfigErrorIsReportedOnceBeforeAnyWorkerStarts) {
  std::string yaml = read_file(fs::path(TRAINER_SOURCE_DIR) / "configs" / "synthetic.yaml");
  yaml.replace(yaml.find("  lr: 0.05"), 9, "  lr: 0.05\n  momentun: 0.9");
  const fs::path bad = dir_ / "bad.yaml";
  std::ofstream(bad) << yaml;
  const std::string args = "--config '" + bad.string() + "' --run-dir '" + (dir_ / "run").string() +
                           "' --set run.progress=never";
  const auto alone = run(args);
  ASSERT_EQ(alone.code, 2) << alone.err;
  for (const std::string& head : {std::string(), std::string("train ")}) {
    const auto r = launch("--nproc-per-node 2", head + args);
    EXPECT_EQ(r.code, 2) << r.err;
    std::istringstream lines(r.out + r.err);
    int mentions = 0;
    for (std::string line; std::getline(lines, line);) {
      mentions += line.find("momentun") != std::string::npos;
    }
    EXPECT_EQ(mentions, 1) << r.err;
    EXPECT_NE(r.err.find(alone.err), std::string::npos) << "launch:\n"
                                                        << r.err << "alone:\n"
                                                        << alone.err;
    EXPECT_EQ(r.err.find("[rank"), std::string::npos) << r.err;  // no worker started
    EXPECT_FALSE(fs::exists(dir_ / "run")) << r.err;
  }
}

// An error every rank finds once started (the data set's folder is missing): its line shown once
// on the console, not once per rank and again in the failure report; exit 2 even when another
// rank fails first on its peer's exit (a process group that could not be formed).
TEST_F(Dist, AnErrorEveryRankFindsIsShownOnce) {
  const std::string args =
      "--config '" +
      (fs::path(TRAINER_SOURCE_DIR) / "configs" / "fashion_mnist_mlp.yaml").string() +
      "' --run-dir '" + (dir_ / "run").string() +
      "' --set run.progress=never --set data.root=" + (dir_ / "nope").string();
  const auto r = launch("--nproc-per-node 2", args);
  EXPECT_EQ(r.code, 2) << r.err;
  std::istringstream lines(r.out + r.err);
  int mentions = 0;
  for (std::string line; std::getline(lines, line);) {
    mentions += line.find("no such directory") != std::string::npos;
  }
  EXPECT_EQ(mentions, 1) << r.err;
}

}  // namespace
